"""DataLoader workers reusing shared-memory segments (``datasets._shm``), over HTTP.

With ``FetchConfig(output="tensor", reuse_shared_memory=True)`` a worker
receives composites into shared segments and, once the main process holds no
tensor of one any more, receives the next into it. What must hold: a tensor
the consumer still holds is never written again; the reuse happens; the
default, and a torch whose count is not where the pool reads it, keep torch's
default strategy; an epoch read to the end leaves nothing in ``/dev/shm``, one
stopped early at most the batches in flight, and a killed worker nothing once
the job has ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
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
    """data_format_fn: the sample, the worker's sharing strategy and its pool's counts."""
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
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]], kind: str, context: str
) -> None:
    name, objects = bucket
    # A short window (8 composites ahead of 24 per worker), so segments come round.
    fetch = FetchConfig(output="tensor", prefetch=16, reuse_shared_memory=True)
    ds, loader = _loader(emulator, name, kind, fetch, context)
    held: list[torch.Tensor] = []  # every fourth batch, kept to the end
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
    assert strategies == {"file_system"}
    assert reused > 0, "no segment was reused"
    assert len(held) >= 300
    # Reused segments were carved only from memory nobody held: every tensor
    # kept since its batch still has its object's bytes.
    for sample in held:
        assert bytes(sample.numpy()) == objects[_key(sample)]
    assert ds.last_epoch_stats.by_op.get("compose", 0) >= COUNT // 32
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


def test_a_torch_without_the_count_where_it_is_read_keeps_fresh_segments(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forked workers inherit the patch: their check of the count fails.
    monkeypatch.setattr(_shm, "_HEADER", 128)
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


def _named_segments_of(pids: list[int]) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if any(n.startswith(f"torch_{p}_") for p in pids)]


def _settled(pids: list[int]) -> list[str]:
    # A worker's names go as its exit and the main process's drops count them
    # down; give that a moment.
    deadline = time.monotonic() + 10
    while _named_segments_of(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _named_segments_of(pids)


def test_an_epoch_read_to_the_end_leaves_no_segment_and_one_stopped_early_its_batches_in_flight(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]]
) -> None:
    name, objects = bucket
    fetch = FetchConfig(output="tensor", prefetch=16, reuse_shared_memory=True)
    _, loader = _loader(emulator, name, "iterable", fetch)
    iterator = iter(loader)
    pids = [w.pid for w in iterator._workers]  # type: ignore[attr-defined]
    assert sum(len(batch) for batch in iterator) == len(objects)
    del iterator
    assert _settled(pids) == []

    iterator = iter(loader)
    pids = [w.pid for w in iterator._workers]  # type: ignore[attr-defined]
    for _ in range(3):
        next(iterator)
    # Each worker's window holds segments it has not handed out yet: made
    # under their own names, as the early stop must clean them.
    assert len(_named_segments_of(pids)) > 8
    del iterator  # stopped early: the workers are closed mid-epoch
    # What is left is at most the batches sent and never read: two per worker
    # (prefetch_factor), each drawing on at most three segments.
    left = _settled(pids)
    assert len(left) <= 2 * 2 * 3, left


_KILL_SCRIPT = """
import json, os, sys, time
from torch.utils.data import DataLoader
from torchbucket.datasets import BucketIterableDataset, FetchConfig, collate_list
from torchbucket.storage.gcs import GCSConfig

def mapped(pid):
    own = f"/dev/shm/torch_{pid}_"
    with open(f"/proc/{pid}/maps") as maps:
        return sorted({line.split()[5] for line in maps if f" {own}" in line})

ds = BucketIterableDataset.from_prefix(
    sys.argv[1],
    gcs=GCSConfig(endpoint=sys.argv[2], anonymous=True),
    fetch=FetchConfig(output="tensor", prefetch=16, reuse_shared_memory=True),
)
loader = DataLoader(
    ds, batch_size=4, num_workers=1, multiprocessing_context="fork", collate_fn=collate_list
)
iterator = iter(loader)
first = next(iterator)  # this process maps the first batch's segments
pid = iterator._workers[0].pid
deadline = time.monotonic() + 30
while len(mapped(pid)) < 8 and time.monotonic() < deadline:
    time.sleep(0.05)
names = mapped(pid)
print(json.dumps({"names": names, "there": [os.path.exists(n) for n in names]}), flush=True)
os.kill(pid, 9)
time.sleep(1)
"""


def test_a_killed_worker_leaves_nothing_in_dev_shm_once_the_job_has_ended(
    emulator: Emulator, tmp_path: Any
) -> None:
    # Under file_system a segment keeps its name while in use. torch's
    # torch_shm_manager removes the names of every segment made through it
    # once all the processes that used it have exited: after a killed worker,
    # when the training process ends (reuse off, torch's default strategy
    # leaves nothing even before: test_large_samples_emulator.py).
    name = f"rkill-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"k/{i:03d}": bytes([i]) * (1 << 20) for i in range(40)})
    # The worker's first reads arrive and wait in its window; the rest hang.
    emulator.add_fault("get", "stall", nth=9, count=None, stall_seconds=20.0)
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
    report = json.loads(done.stdout.splitlines()[0])
    names = report["names"]
    assert len(names) >= 8, done.stderr
    assert all(report["there"]), report
    deadline = time.monotonic() + 20
    while any(os.path.exists(n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [n for n in names if os.path.exists(n)] == []
