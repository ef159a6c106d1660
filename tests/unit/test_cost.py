"""Cost estimates and strategy plans against hand computations."""

from __future__ import annotations

import pytest

from torchbucket import cost
from torchbucket.accounting import RequestStats
from torchbucket.errors import ConfigError

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


def test_plan_of_a_fixed_example_against_a_hand_computation() -> None:
    # 10,000 objects of 100 KiB, 3 epochs, 1 rank x 2 workers, 7-day soft delete.
    sizes = [100 << 10] * 10_000
    plans = {
        p.strategy: p
        for p in cost.plan_strategies(
            sizes, epochs=3, ranks=1, workers=2, soft_delete_seconds=7 * 86400
        )
    }
    direct = plans["direct"]
    assert (direct.per_epoch.class_a, direct.per_epoch.class_b) == (0, 10_000)
    assert direct.once.by_op == {"list": 10}
    assert direct.run.total_usd == pytest.approx(30_000 * 0.0004 / 1000 + 10 * 0.005 / 1000)

    # Compose, per worker shard of 5,000: 64 read directly, then 4,936 in
    # groups of 31 (the anchor takes a compose's first source; 3.1 MiB <=
    # 4 MiB): 159 full groups and one of 7 = 160 composes, 160 GETs of
    # composites, 160 deletes; the anchor's upload and delete; plus 2 policy
    # reads.
    comp = plans["compose"]
    assert comp.per_epoch.by_op == {
        "compose": 320,
        "get": 2 * (64 + 160),
        "delete": 320 + 2,
        "put": 2,
        "bucket_get": 2,
    }
    composite_gib = 2 * 4936 * (100 << 10) / GIB
    per_epoch = 322 * 0.005 / 1000 + 450 * 0.0004 / 1000 + composite_gib * 0.020 * 7 * 24 / 730
    assert comp.epoch.total_usd == pytest.approx(per_epoch)
    assert comp.run.total_usd == pytest.approx(3 * per_epoch + 10 * 0.005 / 1000)
    assert "OFF by default" in comp.note

    shards = plans["shards"]
    # 976.5625 MiB -> 4 shards of 256 MiB; 31 reads of 32 MiB + 4 boundaries
    # + 2 workers x 5 ramp reads (1, 2, 4, 8, 16 MiB before the first 32 MiB one).
    assert shards.per_epoch.by_op == {"get": 31 + 4 + 10}
    # Packing once: 10 + 1 listings, 4 multipart uploads of 16 parts of 16 MiB
    # (initiate, parts, complete), 4 indexes and a manifest; 10,000 source GETs
    # and the manifest's.
    assert shards.once.class_a == 11 + 4 * (1 + 16 + 1) + 5
    assert shards.once.class_b == 10_001


def test_plan_refuses_nonsense() -> None:
    with pytest.raises(ConfigError, match="epochs"):
        cost.plan_strategies([1], epochs=0)
