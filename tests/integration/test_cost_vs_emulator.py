"""``torchbucket.cost``'s plans against an epoch of each strategy as the emulator counts it.

Each strategy reads a real epoch (two DataLoader workers) of a bucket on the
emulator; the plan for the same objects and configs must count the same
requests, class by class and operation by operation, within 5%. The epochs
are sized so the read path's rules show: a worker's 200 objects read their
first ``min(64, prefetch, 200 // 4) = 50`` directly, 16 objects are read in 3
ranges each, and the shards in ranges that ramp up. The planner that
hard-coded 64 and one GET per object counted 138 compose-epoch GETs for 118
(+17%), 400 direct ones for 432 (-7%) and 75 shard reads for 84 (-11%).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from torch.utils.data import DataLoader

from torchbucket import cost
from torchbucket.accounting import RequestStats
from torchbucket.compose import ComposeConfig
from torchbucket.compose._tuning import TUNING
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig
from torchbucket.emulator import Emulator
from torchbucket.shards import BucketShardDataset, PackConfig, ShardReadConfig, pack
from torchbucket.storage.gcs import GCSConfig

pytestmark = pytest.mark.emulator

N = 400
WORKERS = 2
TOLERANCE = 0.05
# Objects of 64 KiB and more are read in ranges of 32 KiB (3 of 96 KiB).
FETCH = FetchConfig(large_object_size=64 << 10, range_size=32 << 10)
COMPOSE = ComposeConfig()
# No group read around a compose path that straggles on a busy machine: each
# would add its objects' GETs to the count. Patched in the test's process,
# the fork-started DataLoader workers have it too.
NO_READ_AROUND = {"read_around_after": 0, "read_around_needed_after": 0}
PACK = PackConfig(shard_size=256 << 10)
READ = ShardReadConfig(range_size=32 << 10, first_range_size=4 << 10)


def _size(i: int) -> int:
    return (96 << 10) if i % 25 == 7 else 1000 + 37 * (i % 29)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"costvs-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"train/{i:05d}.bin": bytes([i % 251]) * _size(i) for i in range(N)})
    return name


def _gcs(emulator: Emulator) -> GCSConfig:
    # No hedged reads: a hedge is one more GET, or one the server never saw.
    retry = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=20.0)
    return GCSConfig(
        endpoint=emulator.endpoint, anonymous=True, retry=retry, hedge=HedgeConfig(enabled=False)
    )


def _counted(emulator: Emulator, bucket: str) -> dict[str, int]:
    ops = emulator.stats()["by_bucket"].get(bucket, {}).get("by_op", {})
    return {op: n for op, n in ops.items() if n}


def _assert_close(planned: RequestStats, counted: dict[str, int]) -> None:
    seen = RequestStats(by_op=counted)
    by_class = {
        "A": (planned.class_a, seen.class_a),
        "B": (planned.class_b, seen.class_b),
        "free": (planned.free, seen.free),
    }
    by_op = {
        op: (planned.by_op.get(op, 0), counted.get(op, 0)) for op in {*planned.by_op, *counted}
    }
    for name, (mine, theirs) in {**by_class, **by_op}.items():
        assert abs(mine - theirs) <= TOLERANCE * theirs, (name, dict(planned.by_op), counted)


def _plans(sizes: list[int]) -> dict[str, cost.StrategyPlan]:
    plans = cost.plan_strategies(
        sizes, epochs=1, workers=WORKERS, fetch=FETCH, compose=COMPOSE, pack=PACK, shard_read=READ
    )
    return {p.strategy: p for p in plans}


def _loader(dataset: Any) -> DataLoader[Any]:
    return DataLoader(
        dataset,
        batch_size=16,
        num_workers=WORKERS,
        multiprocessing_context="fork",
        collate_fn=list,
    )


def _epoch(emulator: Emulator, bucket: str, dataset: Any) -> dict[str, int]:
    emulator.reset_stats()
    samples = sum(len(batch) for batch in _loader(dataset))
    assert samples == N
    return _counted(emulator, bucket)


def test_each_strategys_plan_counts_what_the_emulator_counts(
    emulator: Emulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in NO_READ_AROUND.items():
        monkeypatch.setattr(TUNING, name, value)
    gcs = _gcs(emulator)
    uri = f"gs://{bucket}/train/"
    plans = _plans([_size(i) for i in range(N)])

    # Direct reads: compose off (the map-style dataset reads ahead of the
    # DataLoader's own sampler, and would compose by default).
    direct = BucketMapDataset.from_prefix(
        uri, gcs=gcs, fetch=FETCH, compose=ComposeConfig(enabled=False)
    )
    _assert_close(plans["direct"].per_epoch, _epoch(emulator, bucket, direct))

    composed = BucketIterableDataset.from_prefix(uri, gcs=gcs, fetch=FETCH, compose=COMPOSE)
    counted = _epoch(emulator, bucket, composed)
    assert counted.get("compose", 0) > 0
    _assert_close(plans["compose"].per_epoch, counted)

    packed = f"gs://{bucket}/packed/"
    emulator.reset_stats()
    pack(uri, packed, config=PACK, gcs=gcs, progress=False)
    shards = BucketShardDataset.from_prefix(packed, gcs=gcs, shard_read=READ)
    # Once: the pack (its listing of the source included) and the dataset's opening.
    _assert_close(plans["shards"].once, _counted(emulator, bucket))
    _assert_close(plans["shards"].per_epoch, _epoch(emulator, bucket, shards))
