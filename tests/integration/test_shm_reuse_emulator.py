"""DataLoader workers reusing shared-memory segments (``datasets._shm``), on both bucket kinds.

With ``FetchConfig(output="tensor", reuse_shared_memory=True)`` a worker
receives composites into shared segments and, once the main process holds no
tensor of one any more, receives the next into it. What must hold: a tensor
the consumer still holds is never written again; the reuse happens, by the
pool's own handles; the default, and a worker where the handover cannot work,
keep fresh segments; nothing gets a name in ``/dev/shm``; an epoch read to the
end or stopped early leaves the main process holding no segment, and a killed
worker leaves the main process only what it still holds.

On a zonal bucket (reads over gRPC, ``tests/bucket_kinds.py``) the same
holds; there compose does not exist, so a group of small objects is read
object by object and no compose request is sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import (
    BucketBatchSampler,
    BucketIterableDataset,
    BucketMapDataset,
    FetchConfig,
    _shm,
    collate_list,
)
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig

pytestmark = pytest.mark.emulator

RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)
KIB = 1024
COUNT = 1536  # 48 composites of 32


def payload(i: int) -> bytes:
    unit = f"<reuse-{i:05d}>".encode()
    size = 4 * KIB + 37 * (i % 5)  # composites of a few different sizes
    return (unit * (size // len(unit) + 1))[:size]


@pytest.fixture
def bucket(emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    name = f"reuse-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    objects = {f"s/{i:05d}": payload(i) for i in range(COUNT)}
    emulator.seed(name, objects)
    return name, objects


def with_worker_state(sample: torch.Tensor) -> tuple[torch.Tensor, str, int, int]:
    """data_format_fn: the sample, the worker's sharing strategy and its pool's counts.

    The strategy stays torch's default: the pool hands its segments over its
    own way, and everything else goes torch's.
    """
    pool = _shm.pool()
    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    return sample, strategy, pool.made if pool else -1, pool.reused if pool else -1


def _loader(
    emulator: Emulator, name: str, kind: str, fetch: FetchConfig, context: str = "fork"
) -> tuple[Any, DataLoader[Any]]:
    uri = f"gs://{name}/s/"
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    kwargs: dict[str, Any] = {"batch_size": 32}
    ds: Any
    if kind == "map_fast":
        ds = BucketMapDataset.from_prefix(
            uri, gcs=gcs, fetch=fetch, compose=ComposeConfig(), data_format_fn=with_worker_state
        )
        kwargs = {"batch_sampler": BucketBatchSampler(ds, batch_size=32, seed=3)}
    else:
        ds = BucketIterableDataset.from_prefix(
            uri, gcs=gcs, fetch=fetch, compose=ComposeConfig(), data_format_fn=with_worker_state
        )
    loader = DataLoader(
        ds, num_workers=2, collate_fn=collate_list, multiprocessing_context=context, **kwargs
    )
    return ds, loader


def _key(sample: torch.Tensor) -> str:
    return "s/" + bytes(sample[7:12].numpy()).decode()


@pytest.mark.parametrize(("kind", "context"), [("map_fast", "fork"), ("iterable", "spawn")])
def test_workers_reuse_segments_and_never_write_over_a_tensor_still_held(
    emulator: Emulator,
    bucket: tuple[str, dict[str, bytes]],
    kind: str,
    context: str,
    bucket_kind: str,
) -> None:
    name, objects = bucket
    # A short window (4 composites in flight, 16 ahead of 24 per worker), so
    # segments come round.
    fetch = FetchConfig(output="tensor", reads_in_flight=8, reuse_shared_memory=True)
    ds, loader = _loader(emulator, name, kind, fetch, context)
    held: list[torch.Tensor] = []  # every fourth batch, kept to the end
    opened_before = set(_shm._opened)  # keys: entries of earlier tests may go meanwhile
    seen: dict[str, bytes] = {}
    strategies: set[str] = set()
    reused = 0
    for number, batch in enumerate(loader):
        for sample, strategy, _made, reused_so_far in batch:
            assert sample.is_shared()
            seen[_key(sample)] = bytes(sample.numpy())
            strategies.add(strategy)
            reused = max(reused, reused_so_far)
            if number % 4 == 0:
                held.append(sample)
    assert seen == objects
    assert strategies == {"file_descriptor"}
    assert reused > 0, "no segment was reused"
    assert set(_shm._opened) - opened_before, "no sample came by the pool's handle"
    assert _segment_names() == []
    assert len(held) >= 300
    # Reused segments were carved only from memory nobody held: every tensor
    # kept since its batch still has its object's bytes.
    for sample in held:
        assert bytes(sample.numpy()) == objects[_key(sample)]
    _check_composes(emulator, name, ds.last_epoch_stats.by_op.get("compose", 0), bucket_kind)


def _check_composes(emulator: Emulator, name: str, counted: int, bucket_kind: str) -> None:
    """Composes of the epoch: a composite per group, or, on a zonal bucket, none asked."""
    served = emulator.stats()["by_bucket"][name]["by_op"].get("compose", 0)
    if bucket_kind == "regional":
        assert counted >= COUNT // 32
        assert served >= COUNT // 32
    else:  # a zonal bucket has no compose: the store never asks for one
        assert (counted, served) == (0, 0)
    assert emulator.object_names(name, ComposeConfig().composite_prefix) == []


def test_by_default_torchs_strategy_and_fresh_segments_are_kept(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]]
) -> None:
    name, objects = bucket
    _, loader = _loader(emulator, name, "iterable", FetchConfig(output="tensor"))
    seen: dict[str, bytes] = {}
    states: set[tuple[str, int, int]] = set()
    for batch in loader:
        for sample, strategy, made, reused in batch:
            seen[_key(sample)] = bytes(sample.numpy())
            states.add((strategy, made, reused))
    assert seen == objects
    assert states == {("file_descriptor", -1, -1)}


def test_a_worker_where_the_handover_cannot_work_keeps_fresh_segments(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forked workers inherit the patch: their check fails, as it would without
    # /proc, memfd or OFD locks.
    monkeypatch.setattr(_shm, "_self_test", lambda: "not here")
    name, objects = bucket
    fetch = FetchConfig(output="tensor", reuse_shared_memory=True)
    _, loader = _loader(emulator, name, "map_fast", fetch)
    seen: dict[str, bytes] = {}
    states: set[tuple[str, int, int]] = set()
    for batch in loader:
        for sample, strategy, made, reused in batch:
            seen[_key(sample)] = bytes(sample.numpy())
            states.add((strategy, made, reused))
    assert seen == objects
    assert states == {("file_descriptor", -1, -1)}


def _segment_names() -> list[str]:
    """Names in /dev/shm of segments the pool's workers would have made (none).

    The request budget's directories (``torchbucket-budget-*``) are another
    feature's, with their own lifetime (tests/unit/test_budget.py).
    """
    return [
        n for n in os.listdir("/dev/shm") if "torchbucket" in n and "torchbucket-budget-" not in n
    ]


def _mapped_segments(pid: int | str = "self") -> list[str]:
    """The pool's segments ``pid`` maps or holds a descriptor of (memfds have no name)."""
    with open(f"/proc/{pid}/maps") as maps:
        found = {line.split()[4] for line in maps if "torchbucket-segment" in line}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "torchbucket-segment" in target:
            found.add(str(os.stat(f"/proc/{pid}/fd/{fd}").st_ino))
    return sorted(found)


def test_an_epoch_read_to_the_end_or_stopped_early_leaves_the_main_process_nothing(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]]
) -> None:
    name, objects = bucket
    fetch = FetchConfig(output="tensor", reads_in_flight=16, reuse_shared_memory=True)
    _, loader = _loader(emulator, name, "iterable", fetch)
    iterator = iter(loader)
    assert sum(len(batch) for batch in iterator) == len(objects)
    del iterator
    assert _mapped_segments() == []

    iterator = iter(loader)
    pids = [w.pid for w in iterator._workers]  # type: ignore[attr-defined]
    batches = [next(iterator) for _ in range(3)]
    # Each worker's window comes to hold segments it has not handed out yet
    # (on a zonal bucket a group's segment is made once all its objects have
    # arrived, so not always by the third batch), and this process maps those
    # of the batches it holds; none has a name.
    assert _eventually(lambda: all(len(_mapped_segments(pid)) > 4 for pid in pids))
    assert _mapped_segments() != []
    assert _segment_names() == []
    del iterator  # stopped early: the workers are closed mid-epoch, batches unread
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}/maps") or _wait_gone(pid)
    assert _mapped_segments() != []  # what it still holds stays readable
    assert all(sample.numpy().any() for batch in batches for sample, *_ in batch)
    del batches
    assert _mapped_segments() == []


def _eventually(check: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Whether ``check()`` holds within ``seconds`` (asked every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


_KILL_SCRIPT = """
import json, os, sys, time
from torch.utils.data import DataLoader
from torchbucket.datasets import BucketIterableDataset, FetchConfig, collate_list
from torchbucket.storage.gcs import GCSConfig

def mapped(pid):
    with open(f"/proc/{pid}/maps") as maps:
        return sorted({line.split()[4] for line in maps if "torchbucket-segment" in line})

ds = BucketIterableDataset.from_prefix(
    sys.argv[1],
    gcs=GCSConfig(endpoint=sys.argv[2], anonymous=True),
    fetch=FetchConfig(output="tensor", reads_in_flight=16, reuse_shared_memory=True),
)
loader = DataLoader(
    ds, batch_size=4, num_workers=1, multiprocessing_context="fork", collate_fn=collate_list
)
iterator = iter(loader)
first = next(iterator)  # this process maps the first batch's segments
pid = iterator._workers[0].pid
deadline = time.monotonic() + 30
while len(mapped(pid)) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
segments = mapped(pid)
named = [
    n
    for n in os.listdir("/dev/shm")
    if ("torchbucket" in n and "torchbucket-budget-" not in n) or n.startswith(f"torch_{pid}_")
]
os.kill(pid, 9)
os.waitpid(pid, 0)
held = mapped(os.getpid())  # the first batch's segments, still readable
ok = all(s.numel() == 1 << 20 and bool((s == s[0]).all()) for s in first)  # intact, readable
del first
print(json.dumps({"segments": segments, "named": named, "held": held, "ok": ok,
                  "after": mapped(os.getpid())}), flush=True)
"""


def test_a_killed_worker_leaves_nothing_but_what_the_main_process_holds(
    emulator: Emulator, tmp_path: Any
) -> None:
    # A segment is a memfd: no name, its memory goes with the last process
    # that maps it or holds its descriptor. A killed worker's go with it; the
    # main process keeps what it holds, readable, until it drops it.
    name = f"rkill-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    # Listed (and read) in order: the first 12 under k/a, the rest under k/b.
    served = {f"k/a{i:03d}": bytes([i]) * (1 << 20) for i in range(12)}
    emulator.seed(name, served | {f"k/b{i:03d}": bytes([i]) * (1 << 20) for i in range(12, 40)})
    # The worker's first reads arrive and wait in its window; the rest hang.
    # Chosen by name, not by the order requests reach the server: a worker's
    # 16 reads in flight are as many gRPC streams opened at once, which reach
    # it in any order, and each counts as two "get"s (the stream, its range).
    emulator.add_fault("get", "stall", match="k/b", count=None, stall_seconds=20.0)
    script = tmp_path / "kill.py"
    script.write_text(_KILL_SCRIPT)
    try:
        done = subprocess.run(
            [sys.executable, str(script), f"gs://{name}/k/", emulator.endpoint],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        emulator.clear_faults()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[0])
    # The 12 served objects, 3 to a slab of 4 MiB, and the slabs of reads in flight.
    assert len(report["segments"]) >= 4, report
    assert report["named"] == [], report
    assert report["held"] != [] and report["ok"], report
    assert report["after"] == [], report
