"""The job-wide request budget: its controller, the shared token cell, local mode."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from torchbucket.errors import ConfigError
from torchbucket.runtime import budget
from torchbucket.runtime.budget import BudgetConfig, RateController, budget_class


def test_controller_starts_under_the_documented_rate() -> None:
    ctl = RateController(5000.0, doubling=1200.0)
    assert ctl.rate == pytest.approx(4500.0)
    assert ctl.ceiling == 5000.0  # probed above slowly


def test_controller_ramps_while_used_and_cuts_to_what_was_admitted() -> None:
    ctl = RateController(100.0, doubling=10.0, margin=1.0)
    ctl.ceiling = None
    t = 0.0
    ctl.update(t, 0, 0)
    for _ in range(40):  # 10 s of full use, no throttles: one doubling
        t += 0.25
        ctl.update(t, ctl.rate * 0.25, 0)
    assert ctl.rate == pytest.approx(200.0, rel=0.01)
    t += 0.25
    ctl.update(t, 50.0, 10.0)  # 160/s admitted over the tick, 10 refused
    cut = ctl.rate
    assert cut == pytest.approx(0.9 * 200.0)  # the same factor on every rank
    t += 0.25
    ctl.update(t, 45.0, 5.0)  # the next tick's throttles answer requests sent before
    assert ctl.rate == cut
    assert ctl.cuts == 1
    for _ in range(40):  # used at a tenth of its rate: it stops growing, and never falls
        t += 0.25
        ctl.update(t, ctl.rate * 0.025, 0)
    held = ctl.rate
    assert cut <= held < 1.02 * cut  # the ~2 s average of use ran out
    for _ in range(40):
        t += 0.25
        ctl.update(t, ctl.rate * 0.025, 0)
    assert ctl.rate == held


def test_controller_probes_slowly_near_the_last_throttle() -> None:
    ctl = RateController(100.0, doubling=10.0, margin=1.0)
    ctl.ceiling = None  # no ceiling known before the first throttle
    ctl.update(0.0, 0, 0)
    ctl.update(0.25, 25, 1)  # cut: ceiling 100, rate 90
    ctl.update(0.5, 22, 0)
    slow = ctl.rate
    ctl.update(0.75, slow * 0.25, 0)
    assert ctl.rate / slow == pytest.approx(2 ** (0.25 / 10 / RateController.CAREFUL))
    ctl.update(1.0, 25, 1)  # throttled again at about the same rate: probe slower still
    ctl.update(1.25, 22, 0)
    slower = ctl.rate
    ctl.update(1.5, slower * 0.25, 0)
    assert ctl.rate / slower == pytest.approx(2 ** (0.25 / 10 / RateController.CAREFUL / 2))


def test_write_operations_are_budgeted_apart() -> None:
    assert budget_class("get") == 0
    assert budget_class("list") == 0
    assert budget_class("compose") == 1
    assert budget_class("multipart upload part") == 1
    assert budget_class("put") == 1


def test_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBUCKET_BUDGET", json.dumps({"read_rate": 50}))
    resolved = BudgetConfig().resolved()
    assert resolved.enabled and resolved.read_rate == 50
    monkeypatch.setenv("TORCHBUCKET_BUDGET", "0")
    assert not BudgetConfig(enabled=True).resolved().enabled
    monkeypatch.setenv("TORCHBUCKET_BUDGET", "{nope")
    with pytest.raises(ConfigError):
        BudgetConfig().resolved()
    with pytest.raises(ConfigError):
        BudgetConfig(read_rate=0)


def _spend(n: int, out: multiprocessing.Queue[float]) -> None:  # type: ignore[type-arg]
    b = budget.job_budget("shared-bucket", BudgetConfig(enabled=True, read_rate=200))
    assert b is not None
    waited = 0.0
    for _ in range(n):
        while (w := b.take(0)) < 0:
            time.sleep(-w)
            waited -= w
        time.sleep(w)
        waited += w
    out.put(waited)


def test_forked_workers_share_one_rate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Four forked processes draw 200 requests from one 200/s cell: about a second."""
    monkeypatch.setenv("TORCHBUCKET_BUDGET_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHBUCKET_BUDGET", raising=False)
    main = budget.job_budget("shared-bucket", BudgetConfig(enabled=True, read_rate=200))
    assert main is not None
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[float] = ctx.Queue()  # type: ignore[assignment]
    start = time.monotonic()
    procs = [ctx.Process(target=_spend, args=(50, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    elapsed = time.monotonic() - start
    assert all(p.exitcode == 0 for p in procs)
    status = budget.status()["shared-bucket"]
    assert status["mode"] == "local"
    assert status["read"]["sent"] == 200
    assert status["read"]["rank_rate"] >= 180  # starts at 0.9 of 200; untroubled, it grows
    # Not a timing assertion on speed: the budget must have made them wait at all.
    assert elapsed > 0.5
    assert os.listdir(tmp_path)


def _make_dir(out: Any) -> None:
    out.put(budget._segment_dir())


def test_a_worker_that_made_the_directory_removes_it_when_it_exits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A DataLoader worker ends through multiprocessing (os._exit, no atexit):
    # the directory it made must go with it, not stay in /dev/shm.
    monkeypatch.delenv("TORCHBUCKET_BUDGET_DIR", raising=False)
    monkeypatch.setattr(budget.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(budget.os.path, "isdir", lambda p: p != "/dev/shm" and os.path.lexists(p))
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[str] = ctx.Queue()  # type: ignore[assignment]
    proc = ctx.Process(target=_make_dir, args=(out,))
    proc.start()
    made = out.get(timeout=30)
    proc.join(30)
    assert proc.exitcode == 0
    assert made.startswith(str(tmp_path))
    assert not os.path.exists(made)


def test_directories_of_processes_that_are_gone_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("fork")
    gone = ctx.Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join(30)
    orphan = tmp_path / f"torchbucket-budget-{gone.pid}-abcd1234"
    orphan.mkdir()
    (orphan / "segment").write_bytes(b"x")
    alive = tmp_path / f"torchbucket-budget-{os.getpid()}-efgh5678"
    alive.mkdir()
    other = tmp_path / "torchbucket-segment-1"
    other.write_bytes(b"")
    budget._remove_orphans(str(tmp_path))
    assert not orphan.exists()
    assert alive.exists() and other.exists()


def test_a_stale_controller_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHBUCKET_BUDGET_DIR", str(tmp_path))
    b = budget.job_budget("stale-bucket", BudgetConfig(enabled=True, read_rate=1, stale_after=0.2))
    assert b is not None
    for sync in budget._syncs:
        if sync.segment is b.segment:
            sync.close()
    time.sleep(0.5)
    assert all(b.take(0) == 0.0 for _ in range(10))  # no waiting on a dead controller
    assert b.status()["mode"] == "off"


class _DeadStore:
    def __init__(self, block: float = 0.0) -> None:
        self.block = block
        self.calls = 0

    def add(self, key: str, value: int) -> int:
        self.calls += 1
        if self.block:
            time.sleep(self.block)
        raise RuntimeError("connection reset by peer")


def _sync(tmp_path: Path, name: str, store: _DeadStore, **config: float) -> tuple[Any, Any]:
    from torchbucket.runtime._budget_sync import Sync

    cfg = BudgetConfig(enabled=True, read_rate=100, **config)  # type: ignore[arg-type]
    segment = budget._Segment(str(tmp_path / name))
    sync = Sync(segment, cfg, name)
    sync._connect = lambda: store if not sync._store_failed else None  # type: ignore[method-assign]
    sync.world = 4
    return sync, budget.Budget(segment, cfg)


def test_a_dead_store_turns_the_rank_to_local_mode(tmp_path: Path) -> None:
    store = _DeadStore()
    sync, b = _sync(tmp_path, "dead", store)
    sync.start()
    try:
        for _ in range(5):
            b.take(0)
        time.sleep(1.0)
        assert store.calls == 1  # tried once, then never again
        assert b.status()["mode"] == "local"
        assert b.status()["read"]["rank_rate"] == pytest.approx(25.0, rel=0.2)  # rate / world
    finally:
        sync.close()


def test_a_store_that_never_answers_never_blocks_a_request(tmp_path: Path) -> None:
    store = _DeadStore(block=30.0)  # a hung store call holds the controller thread
    sync, b = _sync(tmp_path, "hung", store, stale_after=0.5)
    sync.start()
    time.sleep(1.2)
    start = time.monotonic()
    waits = [b.take(0) for _ in range(1000)]
    assert time.monotonic() - start < 5.0  # no call waits on the store
    assert set(waits) == {0.0}  # a stale controller: the budget is skipped
    assert b.status()["mode"] == "off"
    sync.stop.set()
