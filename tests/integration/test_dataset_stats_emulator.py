"""A dataset's ``last_epoch_stats`` equal what the emulator counted for that epoch,
summed over two DataLoader workers (fork and spawn), epoch after epoch."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from torch.utils.data import DataLoader

from bucket_kinds import ZonalBuckets
from torchbucket.accounting import RequestStats
from torchbucket.compose import ComposeConfig
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig

pytestmark = pytest.mark.emulator

N = 120
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


def payload(i: int) -> bytes:
    return f"stats-object-{i:05d};".encode() * (1 + i % 7)


def _as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


@pytest.fixture
def uri(emulator: Emulator) -> str:
    name = f"dstats-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"train/{i:05d}": payload(i) for i in range(N)})
    return f"gs://{name}/train/"


def _gcs(emulator: Emulator) -> GCSConfig:
    # No hedged reads: the tests count GETs exactly, and a read slowed by a busy
    # machine would be hedged (one more GET, or one the server never received).
    return GCSConfig(
        endpoint=emulator.endpoint, anonymous=True, retry=RETRY, hedge=HedgeConfig(enabled=False)
    )


def _assert_equal_to_server(mine: RequestStats, emulator: Emulator) -> None:
    server = emulator.stats()
    by_op = {op: n for op, n in server["by_op"].items() if n}
    mine_by_op = dict(mine.by_op)
    # On a zonal bucket each spawned DataLoader worker asks the bucket's kind
    # once (buckets.get, class B). The epoch's stats count it and the server's
    # count for the epoch does not: compared apart, at most one per worker.
    asked = seen = 0
    if isinstance(emulator, ZonalBuckets):
        asked, seen = mine_by_op.pop("bucket_get", 0), by_op.pop("bucket_get", 0)
        assert asked <= 2 and seen <= 2
    assert mine_by_op == by_op
    assert (mine.class_a, mine.class_b - asked, mine.free) == (
        server["by_class"]["A"],
        server["by_class"]["B"] - seen,
        server["by_class"]["free"],
    )
    assert mine.bytes_in == server["bytes_out"]
    assert mine.bytes_out == server["bytes_in"]


def _reads(stats: RequestStats, emulator: Emulator) -> dict[str, int]:
    """The epoch's requests, on a zonal bucket but a worker's question of its kind."""
    zonal = isinstance(emulator, ZonalBuckets)
    return {op: n for op, n in stats.by_op.items() if not (zonal and op == "bucket_get")}


def _composed_or_read(stats: RequestStats, emulator: Emulator) -> None:
    """A read-ahead epoch's requests: composed groups on a regional bucket, GETs on a zonal one."""
    if isinstance(emulator, ZonalBuckets):  # no compose: turned off, never asked
        assert _reads(stats, emulator) == {"get": N}
        return
    assert stats.by_op["compose"] > 0
    # Each composite deleted, and each worker's anchor (its one upload).
    assert stats.by_op["put"] == 2
    assert stats.by_op["delete"] == stats.by_op["compose"] + stats.by_op["put"]


def _epoch(loader: DataLoader[Any]) -> list[bytes]:
    return [sample for batch in loader for sample in batch]


# Spawned workers persist across the epochs: each spawned process imports torch
# (about 1.7 CPU s), and forked ones cover new workers every epoch.
@pytest.mark.parametrize(
    ("context", "compose", "persistent"),
    [("fork", True, False), ("spawn", False, True), ("fork", False, False)],
)
def test_iterable_last_epoch_stats_equal_the_servers(
    emulator: Emulator, uri: str, context: str, compose: bool, persistent: bool
) -> None:
    ds = BucketIterableDataset.from_prefix(
        uri,
        gcs=_gcs(emulator),
        compose=ComposeConfig(enabled=compose, max_composite_object_size=1500),
        shuffle=True,
        fetch=FetchConfig(reads_in_flight=16),
    )
    assert ds.last_epoch_stats == RequestStats()  # the listing is not an epoch's
    loader = DataLoader(
        ds,
        batch_size=16,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=persistent,
        collate_fn=_as_list,
    )
    for epoch in range(2):
        ds.set_epoch(epoch)
        emulator.reset_stats()
        assert sorted(_epoch(loader)) == sorted(payload(i) for i in range(N))
        stats = ds.last_epoch_stats
        _assert_equal_to_server(stats, emulator)
        # Every object read once: as itself, or inside a composite (a zonal
        # bucket has no compose: turned off, never asked).
        if compose and not isinstance(emulator, ZonalBuckets):
            assert stats.by_op["compose"] > 0
            # Each composite deleted, and each worker's anchor (its one upload).
            assert stats.by_op["put"] == 2
            assert stats.by_op["delete"] == stats.by_op["compose"] + stats.by_op["put"]
        else:
            assert _reads(stats, emulator) == {"get": N}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_map_last_epoch_stats_equal_the_servers(emulator: Emulator, uri: str, context: str) -> None:
    ds = BucketMapDataset.from_prefix(uri, gcs=_gcs(emulator))
    loader = DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=context == "spawn",  # as above
        collate_fn=_as_list,
    )
    for _ in range(2):
        if context == "spawn":
            # Persistent map-style workers count on until reset; new (forked)
            # workers each epoch must start from zero by themselves.
            ds.reset_epoch_stats()
        emulator.reset_stats()
        assert sorted(_epoch(loader)) == sorted(payload(i) for i in range(N))
        _assert_equal_to_server(ds.last_epoch_stats, emulator)
        # The workers read ahead of torch's RandomSampler, composing.
        _composed_or_read(ds.last_epoch_stats, emulator)


def test_map_persistent_workers_count_from_reset(emulator: Emulator, uri: str) -> None:
    ds = BucketMapDataset.from_prefix(uri, gcs=_gcs(emulator))
    loader = DataLoader(
        ds,
        batch_size=16,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
        collate_fn=_as_list,
    )
    emulator.reset_stats()
    _epoch(loader)
    _assert_equal_to_server(ds.last_epoch_stats, emulator)
    ds.reset_epoch_stats()
    emulator.reset_stats()
    _epoch(loader)
    _assert_equal_to_server(ds.last_epoch_stats, emulator)
    _composed_or_read(ds.last_epoch_stats, emulator)


def test_without_workers_the_main_process_counts(emulator: Emulator, uri: str) -> None:
    ds = BucketMapDataset.from_prefix(uri, gcs=_gcs(emulator))
    emulator.reset_stats()
    _epoch(DataLoader(ds, batch_size=16, collate_fn=_as_list))
    _assert_equal_to_server(ds.last_epoch_stats, emulator)
