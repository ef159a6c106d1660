"""Large samples over HTTP against the emulator: tensors received on shared memory
and handed from DataLoader workers by handle, parallel ranged reads of big objects
(a fault on one range), memory over epochs, and ``/dev/shm`` after a killed worker."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

from bucket_kinds import stored_names
from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import (
    BucketBatchSampler,
    BucketIterableDataset,
    BucketMapDataset,
    FetchConfig,
    collate_list,
)
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError
from torchbucket.runtime import retry
from torchbucket.storage.gcs import GCSConfig

# Shared test helpers live with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from wait_helper import wait_for

pytestmark = pytest.mark.emulator

# Fast retries: a fault costs milliseconds, a broken test fails in seconds.
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)

KIB = 1024
MIB = 1024 * KIB
# Small thresholds so that a test moves a few MiB, not hundreds.
TENSOR = FetchConfig(output="tensor", large_object_size=1 * MIB, range_size=256 * KIB)


def payload(i: int, size: int) -> bytes:
    unit = f"<large-sample-{i:04d}>".encode()
    return (unit * (size // len(unit) + 1))[:size]


def _sizes(n: int) -> list[int]:
    # Sizes that differ (so default_collate could not stack them), some under
    # the ranged threshold, some over it (split into 256 KiB ranges), one odd.
    return [(64 * KIB, 700 * KIB, 1 * MIB + 3, 2 * MIB + 4097)[i % 4] for i in range(n)]


@pytest.fixture
def bucket(emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    name = f"large-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    objects = {f"s/{i:04d}": payload(i, size) for i, size in enumerate(_sizes(16))}
    emulator.seed(name, objects)
    return name, objects


def _gcs(emulator: Emulator) -> GCSConfig:
    return GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)


def shared_or_fail(sample: torch.Tensor) -> torch.Tensor:
    """A data_format_fn that keeps the zero-copy path: the tensor, as received."""
    assert isinstance(sample, torch.Tensor) and sample.dtype == torch.uint8
    assert sample.is_shared(), "a worker's sample must be on shared memory already"
    return sample


def _key_of(sample: torch.Tensor, objects: dict[str, bytes]) -> str:
    head = bytes(sample[:19].numpy())
    return next(k for k, v in objects.items() if v[:19] == head)


@pytest.mark.parametrize(
    ("kind", "context"),
    [("map", "fork"), ("map", "spawn"), ("iterable", "fork"), ("iterable", "spawn")],
)
def test_tensor_output_through_workers_is_exact_and_on_shared_memory(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]], kind: str, context: str
) -> None:
    name, objects = bucket
    uri = f"gs://{name}/s/"
    ds: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(
            uri, gcs=_gcs(emulator), data_format_fn=shared_or_fail, fetch=TENSOR
        )
    else:
        ds = BucketIterableDataset.from_prefix(
            uri, gcs=_gcs(emulator), data_format_fn=shared_or_fail, fetch=TENSOR
        )
    loader = DataLoader(
        ds, batch_size=3, num_workers=2, multiprocessing_context=context, collate_fn=collate_list
    )
    seen: dict[str, bytes] = {}
    for batch in loader:
        assert isinstance(batch, list)
        for sample in batch:
            assert isinstance(sample, torch.Tensor) and sample.dtype == torch.uint8
            assert sample.is_shared()
            seen[_key_of(sample, objects)] = bytes(sample.numpy())
    assert seen == objects


@pytest.mark.parametrize("kind", ["map_fast", "iterable"])
def test_tensor_output_of_composed_objects_is_views_of_one_composite(
    emulator: Emulator, kind: str
) -> None:
    # Small objects composed server-side: each composite is received into one
    # shared tensor and its objects are views of it, so a batch crosses from
    # the worker as one handle per composite (a tensor per object cost a
    # handle and a shared-memory segment per object).
    name = f"tcomp-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    objects = {f"s/{i:04d}": payload(i, 8 * KIB + i) for i in range(48)}
    emulator.seed(name, objects)
    uri = f"gs://{name}/s/"
    fetch = FetchConfig(output="tensor")
    compose = ComposeConfig()
    loader_kwargs: dict[str, Any] = {"batch_size": 16}
    ds: Any
    if kind == "map_fast":
        ds = BucketMapDataset.from_prefix(
            uri, gcs=_gcs(emulator), data_format_fn=shared_or_fail, fetch=fetch, compose=compose
        )
        loader_kwargs = {"batch_sampler": BucketBatchSampler(ds, batch_size=16, seed=1)}
    else:
        ds = BucketIterableDataset.from_prefix(
            uri, gcs=_gcs(emulator), data_format_fn=shared_or_fail, fetch=fetch, compose=compose
        )
    loader = DataLoader(ds, num_workers=2, collate_fn=collate_list, **loader_kwargs)
    seen: dict[str, bytes] = {}
    sharing = 0  # samples of a batch that share another's memory
    for batch in loader:
        for sample in batch:
            assert isinstance(sample, torch.Tensor) and sample.is_shared()
            key = next(k for k, v in objects.items() if len(v) == sample.numel())
            seen[key] = bytes(sample.numpy())
        sharing += len(batch) - len({s.untyped_storage().data_ptr() for s in batch})
    assert seen == objects
    assert ds.last_epoch_stats.by_op.get("compose", 0) > 0
    assert sharing > 0
    assert stored_names(emulator, name, compose.composite_prefix) == []


@pytest.mark.parametrize("kind", ["map", "map_fast", "iterable"])
@pytest.mark.parametrize(
    ("size", "count", "per_batch", "segments_most"),
    # Up to 2 MiB objects are carved: the window's segments are 4 MiB, so 3 of
    # 1 MiB + a few bytes share one and a batch of 8 crosses in at most 4.
    [(8 * KIB, 48, 16, 2), (MIB, 16, 8, 4)],
    ids=["8kib", "1mib"],
)
def test_tensor_output_of_objects_read_one_by_one_shares_a_few_segments(
    emulator: Emulator, kind: str, size: int, count: int, per_batch: int, segments_most: int
) -> None:
    # Compose off: every object is its own GET. Each one used to get its own
    # shared-memory segment, so a batch of 16 crossed from the worker as 16
    # handles (each a connection to the worker's resource sharer). They are
    # now carved in order out of a few segments, at 64-byte aligned offsets.
    name = f"tslab-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    objects = {f"s/{i:04d}": payload(i, size + 3 * i) for i in range(count)}
    emulator.seed(name, objects)
    uri = f"gs://{name}/s/"
    fetch = FetchConfig(output="tensor")
    compose = ComposeConfig(enabled=False)
    loader_kwargs: dict[str, Any] = {"batch_size": per_batch}
    ds: Any
    if kind == "iterable":
        ds = BucketIterableDataset.from_prefix(
            uri, gcs=_gcs(emulator), data_format_fn=shared_or_fail, fetch=fetch, compose=compose
        )
    else:
        ds = BucketMapDataset.from_prefix(
            uri, gcs=_gcs(emulator), data_format_fn=shared_or_fail, fetch=fetch, compose=compose
        )
        if kind == "map_fast":
            loader_kwargs = {"batch_sampler": BucketBatchSampler(ds, batch_size=per_batch, seed=1)}
    loader = DataLoader(ds, num_workers=2, collate_fn=collate_list, **loader_kwargs)
    seen: dict[str, bytes] = {}
    for batch in loader:
        for sample in batch:
            assert isinstance(sample, torch.Tensor) and sample.is_shared()
            assert sample.storage_offset() % 64 == 0
            key = next(k for k, v in objects.items() if len(v) == sample.numel())
            seen[key] = bytes(sample.numpy())
        # One segment for a batch read at once; a window's segment (64
        # objects, at most 4 MiB) may end inside a batch.
        assert len({s.untyped_storage().data_ptr() for s in batch}) <= segments_most
    assert seen == objects
    assert ds.last_epoch_stats.by_op.get("compose", 0) == 0


def test_bytes_stay_the_default_and_large_ones_are_read_in_ranges(
    emulator: Emulator, bucket: tuple[str, dict[str, bytes]], bucket_kind: str
) -> None:
    name, objects = bucket
    fetch = FetchConfig(large_object_size=1 * MIB, range_size=256 * KIB)
    ds = BucketMapDataset.from_prefix(f"gs://{name}/s/", gcs=_gcs(emulator), fetch=fetch)
    emulator.reset_stats()
    got = ds.__getitems__(list(range(len(ds))))
    assert all(type(x) is bytes for x in got)
    assert dict(zip(sorted(objects), got, strict=True)) == objects
    # 4 x 1 MiB + 3 bytes (5 ranges) and 4 x 2 MiB + 4097 (9 ranges), 8 read
    # whole (more if a slow read was hedged): one GET per object would be 16.
    # On a zonal bucket an object's ranges go out together on one read stream,
    # which the bucket counts as one read.
    gets = emulator.stats()["by_op"]["get"]
    assert gets >= (4 * 5 + 4 * 9 + 8 if bucket_kind == "regional" else 16)


@pytest.mark.parametrize("fault", ["503", "reset", "truncate", "corrupt"])
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_a_fault_on_one_range_of_a_big_object_still_gives_its_exact_bytes(
    emulator: Emulator, fault: str, kind: str, bucket_kind: str
) -> None:
    name = f"big-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    data = payload(7, 9 * MIB + 123)
    emulator.seed(name, {"big/0": data})
    # 8 MiB ranges over 9 MiB: two; the second request the bucket sees fails.
    fetch = FetchConfig(output="tensor")
    ds: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(f"gs://{name}/big/", gcs=_gcs(emulator), fetch=fetch)
    else:
        ds = BucketIterableDataset.from_prefix(f"gs://{name}/big/", gcs=_gcs(emulator), fetch=fetch)
    emulator.reset_stats()
    emulator.add_fault("get", fault, nth=2, match="big/0")
    sample = ds[0] if kind == "map" else next(iter(ds))
    assert isinstance(sample, torch.Tensor)
    assert bytes(sample.numpy()) == data
    stats = emulator.stats()
    assert stats["faults"].get(fault) == 1
    # Two ranges, and the failed one again (a corrupt range passes its length
    # check: the object's CRC32C fails and both ranges are read again); more
    # only if a slow read was hedged. On a zonal bucket both ranges share one
    # read stream (one read), each chunk carries its CRC32C, and only the
    # failed range is asked again, on a stream of its own.
    if bucket_kind == "regional":
        assert stats["by_op"]["get"] >= (4 if fault == "corrupt" else 3)
    else:
        assert stats["by_op"]["get"] >= 2


def test_a_big_object_corrupted_on_every_read_is_an_integrity_error_naming_it(
    emulator: Emulator,
) -> None:
    name = f"big-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {"big/0": payload(3, 3 * MIB)})
    fetch = FetchConfig(output="tensor", large_object_size=1 * MIB, range_size=1 * MIB)
    ds = BucketMapDataset.from_prefix(f"gs://{name}/big/", gcs=_gcs(emulator), fetch=fetch)
    emulator.add_fault("get", "corrupt", nth=1, count=None, match="big/0")
    before = emulator.stats()["by_op"].get("get", 0)
    with pytest.raises(IntegrityError, match=f"gs://{name}/big/0"):
        ds[0]
    # Read a few times, not until the retry deadline (hundreds of GETs): each
    # of its 3 ranges at most retry.CORRUPT_ANSWERS times (on a zonal bucket a
    # GET is a read stream, and each ends at a corrupt chunk of one of them).
    assert emulator.stats()["by_op"].get("get", 0) - before <= 3 * retry.CORRUPT_ANSWERS


def _tree_rss(server: int | None) -> int:
    """RSS of this process and its children but the emulator's (its buffers grow
    with the requests in flight, which read-ahead raises: a plateau, not ours)."""
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)] if p.pid != server)


def test_memory_stays_bounded_over_five_epochs(emulator: Emulator, bucket_kind: str) -> None:
    """A leak check: an epoch hands over 48 MiB of tensors; five must not keep them."""
    name = f"rss-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"r/{i:03d}": payload(i, 2 * MIB) for i in range(24)})
    ds = BucketMapDataset.from_prefix(
        f"gs://{name}/r/",
        gcs=_gcs(emulator),
        fetch=FetchConfig(output="tensor", large_object_size=1 * MIB, range_size=1 * MIB),
    )
    # Regional: torch's RandomSampler, read ahead (datasets/_observed.py).
    # Zonal: batch at a time (a plain range is not read ahead of). Read ahead
    # over gRPC, each worker's RSS climbs for its first ten epochs or so (a
    # BucketBatchSampler's too) and then stays: 244-256 MiB after 5 epochs,
    # 264-280 after 25, 268-280 after 40 (48 MiB read each); more than this
    # bound allows in epochs 2-6, though not a leak.
    order: dict[str, Any] = (
        {"shuffle": True} if bucket_kind == "regional" else {"sampler": range(24)}
    )
    loader = DataLoader(
        ds,
        batch_size=4,
        **order,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        collate_fn=collate_list,
    )

    def epoch() -> int:
        total = sum(int(t.numel()) for batch in loader for t in batch)
        gc.collect()
        return total

    assert epoch() == 24 * 2 * MIB
    before = _tree_rss(emulator.pid)
    # The DataLoader's own shared memory (made by the main process) stays.
    held = _shm_fds(os.getpid())
    for _ in range(5):
        assert epoch() == 24 * 2 * MIB
    grown = _tree_rss(emulator.pid) - before
    # Holding what the epochs read would grow it by 48 MiB an epoch (240 MiB).
    assert grown < 24 * MIB, f"RSS of the main process and workers grew by {grown / MIB:.1f} MiB"
    # Every handed-over tensor's memory and descriptor went with it.
    assert _shm_fds(os.getpid()) == held


def _shm_fds(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            out.append(target)
    return out


def _unchanged_for(value: Callable[[], list[str]], seconds: float) -> Callable[[], bool]:
    """A condition that holds once ``value()`` has not changed for ``seconds``."""
    seen: list[Any] = [None, 0.0]

    def condition() -> bool:
        now, current = time.monotonic(), value()
        if current != seen[0]:
            seen[:] = [current, now]
        return now - seen[1] >= seconds

    return condition


def test_worker_killed_mid_epoch_leaves_nothing_in_dev_shm(emulator: Emulator) -> None:
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    name = f"kill-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"k/{i:03d}": payload(i, 1 * MIB) for i in range(40)})
    # The worker's first reads arrive and wait in its window; the rest hang.
    emulator.add_fault("get", "stall", nth=9, count=None, stall_seconds=30.0)
    ds = BucketIterableDataset.from_prefix(
        f"gs://{name}/k/",
        gcs=_gcs(emulator),
        # torch's default strategy, whose segments are unlinked as they are
        # made (reusing them, the default, shares by name: tested in
        # test_shm_reuse_emulator.py).
        fetch=FetchConfig(output="tensor", reads_in_flight=16, reuse_shared_memory=False),
    )
    loader = DataLoader(
        ds, batch_size=32, num_workers=1, multiprocessing_context="fork", collate_fn=collate_list
    )
    # The worker inherits this process's descriptors, shared memory of earlier
    # tests' datasets among them (a clean-clone CI run counted them with the
    # worker's own before those were made): only the worker's own count.
    inherited = set(_shm_fds(os.getpid()))
    iterator = iter(loader)

    def consume() -> None:
        try:
            next(iterator)
        except Exception:  # the DataLoader reports the killed worker here too
            pass

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    worker_pid = iterator._workers[0].pid  # type: ignore[attr-defined]

    # The worker holds received samples in shared memory, already unlinked.
    def own() -> list[str]:
        return [t for t in _shm_fds(worker_pid) if t not in inherited]

    def undeleted() -> list[str]:
        return [t for t in own() if not t.endswith("(deleted)")]

    assert wait_for(lambda: len(own()) >= 8)
    # Kill it once it has stopped making segments: torch names a segment in
    # /dev/shm and unlinks it a moment later (shm_open, ftruncate, mmap,
    # shm_unlink), and a SIGKILL inside that moment leaves the name behind,
    # which no code of a dataset can prevent (a clean-clone CI run killed the
    # worker while its window's first segments were still being made).
    assert wait_for(_unchanged_for(own, seconds=0.5)), own()
    assert not undeleted(), undeleted()
    with pytest.raises(RuntimeError, match="killed by signal"):
        os.kill(worker_pid, signal.SIGKILL)
        time.sleep(30)
    thread.join(60)
    emulator.clear_faults()
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{worker_pid}_")]
    assert left == []
