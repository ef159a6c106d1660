"""Datasets over HTTP against the emulator: DataLoader with fork and spawn workers,
compose on and off, composites always deleted, faults, a killed worker, and the
workers' frozen garbage collector."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from bucket_kinds import stored_names
from gc_helper import frozen_at_first_call
from torchbucket import runtime
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig, cleanup_composites
from torchbucket.compose import _fetch as compose_fetch
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig, _heap
from torchbucket.emulator import Emulator
from torchbucket.errors import ConfigError, NotFoundError
from torchbucket.storage.gcs import GCSConfig, GCSStore

# Shared test helpers live with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from wait_helper import wait_for

pytestmark = pytest.mark.emulator

N = 200
# Fast retries: a fault costs milliseconds, a broken test fails in seconds.
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


def payload(i: int) -> bytes:
    return f"gcs-object-{i:05d};".encode() * (1 + i % 11)


def _as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"ds-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"train/{i:05d}": payload(i) for i in range(N)})
    return name


def _gcs(emulator: Emulator) -> GCSConfig:
    return GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)


@pytest.mark.parametrize(
    ("kind", "context", "compose"),
    [
        ("map", "fork", True),
        ("map", "spawn", False),
        ("iterable", "fork", True),
        ("iterable", "fork", False),
        ("iterable", "spawn", True),
    ],
)
def test_epoch_through_workers_reads_each_object_once_and_leaves_no_composite(
    emulator: Emulator, bucket: str, kind: str, context: str, compose: bool, bucket_kind: str
) -> None:
    uri = f"gs://{bucket}/train/"
    config = ComposeConfig(enabled=compose, max_composite_object_size=2000)
    ds: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(uri, gcs=_gcs(emulator), compose=config)
        loader = DataLoader(
            ds,
            batch_size=32,
            shuffle=True,
            num_workers=2,
            multiprocessing_context=context,
            collate_fn=_as_list,
        )
    else:
        ds = BucketIterableDataset.from_prefix(
            uri,
            gcs=_gcs(emulator),
            compose=config,
            shuffle=True,
            fetch=FetchConfig(reads_in_flight=48),
        )
        loader = DataLoader(
            ds, batch_size=32, num_workers=2, multiprocessing_context=context, collate_fn=_as_list
        )
    before = emulator.stats()["by_op"].get("compose", 0)
    seen = [sample for batch in loader for sample in batch]
    assert sorted(seen) == sorted(payload(i) for i in range(N))
    composed = emulator.stats()["by_op"].get("compose", 0) - before
    # A zonal bucket has no compose: turned off (one INFO line), never asked.
    assert (composed > 0) is (compose and bucket_kind == "regional")
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []


def test_compose_refused_over_http_falls_back_with_one_warning(
    emulator: Emulator, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    compose_fetch._warned.discard("refused")
    emulator.add_fault("compose", "403", count=None)
    ds = BucketMapDataset.from_prefix(
        f"gs://{bucket}/train/", gcs=_gcs(emulator), compose=ComposeConfig()
    )
    with caplog.at_level(logging.WARNING, logger="torchbucket"):
        got = ds.__getitems__(list(range(64))) + ds.__getitems__(list(range(64, 128)))
    assert got == [payload(i) for i in range(128)]
    refusals = [r for r in caplog.records if "compose refused" in r.getMessage()]
    assert len(refusals) == 1
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []


def test_object_rewritten_after_listing_raises_over_http(emulator: Emulator, bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(
        f"gs://{bucket}/train/", gcs=_gcs(emulator), compose=ComposeConfig()
    )
    emulator.seed(bucket, {"train/00007": payload(7)})  # same bytes, a new generation
    with pytest.raises(NotFoundError, match="train/00007"):
        ds.__getitems__(list(range(16)))
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []


def test_worker_killed_mid_epoch_leaves_composites_that_cleanup_removes(
    emulator: Emulator, bucket: str
) -> None:
    # Deletes hang, so the worker is caught holding composites when it dies.
    emulator.add_fault("delete", "stall", count=None, stall_seconds=30.0)
    ds = BucketMapDataset.from_prefix(
        f"gs://{bucket}/train/",
        gcs=_gcs(emulator),
        compose=ComposeConfig(max_composite_object_size=2000),
    )
    loader = DataLoader(
        ds, batch_size=64, num_workers=1, multiprocessing_context="fork", collate_fn=_as_list
    )
    iterator = iter(loader)

    def consume() -> None:
        try:
            next(iterator)
        except Exception:  # the DataLoader reports the killed worker here too
            pass

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert wait_for(lambda: bool(stored_names(emulator, bucket, COMPOSITE_PREFIX)))
    worker_pid = iterator._workers[0].pid  # type: ignore[attr-defined]
    # The DataLoader's SIGCHLD handler reports the death in the main thread.
    with pytest.raises(RuntimeError, match="killed by signal"):
        os.kill(worker_pid, signal.SIGKILL)
        time.sleep(30)
    thread.join(60)
    emulator.clear_faults()
    left = stored_names(emulator, bucket, COMPOSITE_PREFIX)
    assert left
    store = GCSStore(bucket, config=_gcs(emulator))
    assert runtime.run(cleanup_composites(store)) == len(left)
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []
    assert len(stored_names(emulator, bucket, "train/")) == N


def _read_in_workers(
    emulator: Emulator, bucket: str, kind: str, freeze: bool, fn: Callable[[bytes], Any]
) -> list[Any]:
    """Every sample of ``train/`` through ``fn`` in two forked DataLoader workers."""
    cls = BucketMapDataset if kind == "map" else BucketIterableDataset
    ds = cls.from_prefix(
        f"gs://{bucket}/train/",
        gcs=_gcs(emulator),
        fetch=FetchConfig(freeze_gc=freeze),
        data_format_fn=fn,
    )
    loader = DataLoader(
        ds, batch_size=16, num_workers=2, multiprocessing_context="fork", collate_fn=_as_list
    )
    return [s for batch in loader for s in batch]


def seen_by_worker(data: bytes) -> tuple[int, int, bytes]:
    """A data_format_fn run in the worker: its pid, its frozen count, the bytes."""
    return (*frozen_at_first_call(), data)


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("freeze", [True, False])
def test_workers_freeze_the_collector_before_their_first_read(
    emulator: Emulator, bucket: str, kind: str, freeze: bool
) -> None:
    # FetchConfig.freeze_gc (datasets/workers.py): in every worker, never in
    # the main process, not at all when turned off.
    frozen_in_main = gc.get_freeze_count()
    samples = _read_in_workers(emulator, bucket, kind, freeze, seen_by_worker)

    assert sorted(data for _, _, data in samples) == sorted(payload(i) for i in range(N))
    pids = {pid for pid, _, _ in samples}
    assert len(pids) == 2 and os.getpid() not in pids
    counts = [count for _, count, _ in samples]
    if freeze:
        # Each worker's count at its first read (gc_helper): the freeze came
        # before the first read, and it took what the worker inherited.
        assert min(counts) > frozen_in_main + 10_000
    else:
        assert set(counts) == {frozen_in_main}
    assert gc.get_freeze_count() == frozen_in_main  # the main process is left alone


def settled_in_worker(data: bytes) -> tuple[int, bool, bytes]:
    """A data_format_fn run in the worker: its pid, whether its allocator was settled, the bytes."""
    return os.getpid(), _heap._settled, data


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("freeze", [True, False])
def test_workers_settle_their_allocator_before_their_first_read(
    emulator: Emulator, bucket: str, kind: str, freeze: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # datasets/workers.py: a worker of a first epoch, forked before the main
    # process settled at its first hand-over, settles itself, whatever
    # freeze_gc says; the main process is left as it was.
    monkeypatch.setattr(_heap, "_settled", False)
    samples = _read_in_workers(emulator, bucket, kind, freeze, settled_in_worker)

    assert sorted(data for _, _, data in samples) == sorted(payload(i) for i in range(N))
    assert len({pid for pid, _, _ in samples} - {os.getpid()}) == 2
    assert all(settled for _, settled, _ in samples)
    assert _heap._settled is False


def test_freeze_gc_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"FetchConfig\.freeze_gc"):
        FetchConfig(freeze_gc="yes")  # type: ignore[arg-type]
