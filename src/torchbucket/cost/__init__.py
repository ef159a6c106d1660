"""What requests and retained bytes cost at GCS list prices, and a plan per read strategy.

::

    from torchbucket import accounting, cost

    with accounting.measure() as m:
        for batch in loader:
            ...
    print(cost.estimate(m.stats).summary())

:data:`PRICES` is the one price table: US dollars at Google's list prices for a
US region (``us-central1``) and the US multi-region, from
https://cloud.google.com/storage/pricing (operations per 1,000, storage per
GiB-month, retrieval per GiB; read 2026-12-01, prices as published since the
2024 operations repricing). Prices differ by region, contract and currency:
pass your own :class:`Prices` (``estimate(stats, prices=...)``) to override.
Network egress is left out (free to Compute Engine in the bucket's region).

Soft delete: a bucket with soft delete on keeps every deleted object, billed
as storage for the retention window (https://cloud.google.com/storage/docs/soft-delete);
objects of the Nearline, Coldline and Archive classes are billed for their
minimum storage duration even when deleted earlier
(https://cloud.google.com/storage/pricing#early-delete). Each composite that
compose writes and deletes is therefore billed for the longer of the two, which
:func:`estimate` adds as ``retained_bytes``.

:func:`plan_strategies` counts what each read strategy would ask of the
bucket by the features' own planning rules (``torchbucket.datasets.estimate``,
``torchbucket.shards.estimate``) and their configs' defaults, so a change to
the read path changes the plan with it; ``tests/integration/test_cost_vs_emulator.py``
holds the plans to what the emulator counts.
"""

from __future__ import annotations

from torchbucket.cost._plan import StrategyPlan, plan_strategies
from torchbucket.runtime.prices import (
    PRICES,
    PRICES_DATE,
    PRICES_SOURCE,
    CostEstimate,
    Prices,
    estimate,
    prices_for,
)

__all__ = [
    "PRICES",
    "PRICES_DATE",
    "PRICES_SOURCE",
    "CostEstimate",
    "Prices",
    "StrategyPlan",
    "estimate",
    "plan_strategies",
    "prices_for",
]
