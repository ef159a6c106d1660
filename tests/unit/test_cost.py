"""Cost estimates and strategy plans against hand computations."""

from __future__ import annotations

from typing import Any

import pytest

from torchbucket import cost
from torchbucket.accounting import RequestStats
from torchbucket.compose import ComposeConfig
from torchbucket.datasets import FetchConfig
from torchbucket.errors import ConfigError
from torchbucket.shards import PackConfig, ShardReadConfig

GIB = 1 << 30


def test_estimate_of_counted_requests_at_list_prices() -> None:
    stats = RequestStats(by_op={"list": 10, "put": 40, "get": 25_000, "delete": 7})
    est = cost.estimate(stats)
    # Standard, region: $0.005 per 1,000 class A, $0.0004 per 1,000 class B.
    assert est.class_a == 50 and est.class_b == 25_000 and est.free == 7
    assert est.operations_usd == pytest.approx(50 * 0.005 / 1000 + 25_000 * 0.0004 / 1000)
    assert est.total_usd == pytest.approx(0.00025 + 0.01)
    multi = cost.estimate(stats, location_type="multi-region")
    assert multi.operations_usd == pytest.approx(50 * 0.010 / 1000 + 0.01)


def test_retained_composites_are_billed_for_the_retention_or_the_minimum_duration() -> None:
    week = 7 * 86400
    est = cost.estimate(RequestStats(), retained_bytes=10 * GIB, retention_seconds=week)
    # 10 GiB x $0.020 per GiB-month x (7 x 24 h / 730 h per month)
    assert est.retained_storage_usd == pytest.approx(10 * 0.020 * 7 * 24 / 730)
    # Nearline: 30 days minimum storage duration, even with soft delete off.
    nearline = cost.estimate(RequestStats(), storage_class="NEARLINE", retained_bytes=GIB)
    assert nearline.retained_days == 30
    assert nearline.retained_storage_usd == pytest.approx(0.010 * 30 * 24 / 730)


def test_prices_are_overridable_and_unknown_ones_named() -> None:
    mine = cost.Prices(class_a_per_1000=1.0, class_b_per_1000=0.5, storage_gib_month=0.0)
    est = cost.estimate(RequestStats(by_op={"put": 1000, "get": 2000}), prices=mine)
    assert est.total_usd == pytest.approx(1.0 + 1.0)
    with pytest.raises(ConfigError, match="'mars'"):
        cost.prices_for("mars")


def _plans(sizes: list[int], **kw: Any) -> dict[str, cost.StrategyPlan]:
    return {p.strategy: p for p in cost.plan_strategies(sizes, **kw)}


def test_plan_of_a_fixed_example_against_a_hand_computation() -> None:
    # 10,000 objects of 32 KiB, 3 epochs, 1 rank x 2 workers, 7-day soft delete.
    # (Objects of COMPOSE_BELOW and more are read directly: datasets/_units.)
    plans = _plans([32 << 10] * 10_000, epochs=3, workers=2, soft_delete_seconds=7 * 86400)
    direct = plans["direct"]
    assert (direct.per_epoch.class_a, direct.per_epoch.class_b) == (0, 10_000)
    assert direct.once.by_op == {"list": 10}
    assert direct.run.total_usd == pytest.approx(30_000 * 0.0004 / 1000 + 10 * 0.005 / 1000)

    # Compose, per worker shard of 5,000: min(64, reads_in_flight 128, 5,000 // 4)
    # = 64 read directly; the window plans 2,048 positions at a time, so
    # 1,984, 2,048 and 904 objects in groups of 31 (the anchor takes a
    # compose's first source; 0.97 MiB <= 4 MiB): 64 + 67 + 30 = 161 composes,
    # 161 GETs of composites, 161 deletes; the anchor's upload and delete.
    comp = plans["compose"]
    assert comp.per_epoch.by_op == {
        "compose": 322,
        "get": 2 * (64 + 161),
        "delete": 322 + 2,
        "put": 2,
    }
    # The listing, and the bucket's soft-delete policy read once by the rank.
    assert comp.once.by_op == {"list": 10, "bucket_get": 1}
    composite_gib = 2 * 4936 * (32 << 10) / GIB
    per_epoch = 324 * 0.005 / 1000 + 450 * 0.0004 / 1000 + composite_gib * 0.020 * 7 * 24 / 730
    assert comp.epoch.total_usd == pytest.approx(per_epoch)
    assert comp.run.total_usd == pytest.approx(3 * per_epoch + 11 * 0.0045 / 1000, rel=1e-3)
    assert "OFF by default" in comp.note
    # What the note says of the groups is what the estimate counts: 31 objects.
    assert "groups of <= 31 objects (and the window anchor)" in comp.note


def test_the_first_objects_read_directly_follow_the_windows_rule() -> None:
    # 100 objects, one window: min(64, 128, 100 // 4) = 25 read directly, then
    # 75 in groups of 31, 31 and 13.
    comp = _plans([1000] * 100, epochs=1, workers=0)["compose"]
    assert comp.per_epoch.by_op == {"get": 25 + 3, "compose": 3, "delete": 3 + 1, "put": 1}
    # reads_in_flight=8: 8 read directly, 92 in 3 groups.
    comp = _plans([1000] * 100, epochs=1, workers=0, fetch=FetchConfig(reads_in_flight=8))[
        "compose"
    ]
    assert comp.per_epoch.by_op["get"] == 8 + 3
    # Compose off: the iterable dataset reads every object.
    off = ComposeConfig(enabled=False)
    comp = _plans([1000] * 100, epochs=1, workers=0, compose=off)["compose"]
    assert comp.per_epoch.by_op == {"get": 100}
    assert comp.once.by_op == {"list": 1}


def test_large_objects_are_planned_as_ranged_reads() -> None:
    # From FetchConfig.large_object_size (8 MiB), one GET per 8 MiB range.
    direct = _plans([20 << 20, 1000], epochs=1)["direct"]
    assert direct.per_epoch.by_op == {"get": 3 + 1}


def test_shards_plan_of_a_small_example_against_a_hand_computation() -> None:
    # 8 objects of 1,536 bytes: 2,048 in a tar with their header; shards of at
    # most 9,216 bytes hold 4 (and the 1,024 bytes of end-of-archive blocks).
    pack = PackConfig(shard_size=9216)
    read = ShardReadConfig(first_range_size=1024, range_size=2048)
    shards = _plans([1536] * 8, epochs=2, workers=2, pack=pack, shard_read=read)["shards"]
    # A worker reads one shard's data, bytes 512 to 8,192: reads of 1,024,
    # 2,048, 2,048, 2,048 and the last 512.
    assert shards.per_epoch.by_op == {"get": 2 * 5}
    assert shards.per_epoch.bytes_in == 2 * (8192 - 512)
    # Once: the source's listing; the pack's listing of its destination and of
    # multipart uploads left behind, 8 GETs, 2 uploads of one part, 2 indexes
    # and the manifest; the dataset's listing, manifest and 2 indexes.
    assert shards.once.by_op == {
        "list": 1 + 1 + 1,
        "mpu_list": 1,
        "get": 8 + 1 + 2,
        "mpu_initiate": 2,
        "mpu_part": 2,
        "mpu_complete": 2,
        "put": 3,
    }
    assert shards.run.class_b == 11 + 2 * 10


def test_plan_refuses_nonsense() -> None:
    with pytest.raises(ConfigError, match="epochs"):
        cost.plan_strategies([1], epochs=0)
