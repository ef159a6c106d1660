"""The price table: GCS list prices, and what some requests cost at them.

:data:`PRICES` is the one price table: US dollars at Google's list prices for a
US region (``us-central1``) and the US multi-region, from
https://cloud.google.com/storage/pricing (operations per 1,000, storage per
GiB-month, retrieval per GiB; read 2026-12-01, prices as published since the
2024 operations repricing). Users reach it as :mod:`torchbucket.cost`, which
re-exports it beside the plans per read strategy (see its docstring for soft
delete and the minimum storage durations that :func:`estimate` bills).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torchbucket.errors import ConfigError
from torchbucket.runtime.accounting import RequestStats

__all__ = [
    "DAY_S",
    "PRICES",
    "PRICES_DATE",
    "PRICES_SOURCE",
    "CostEstimate",
    "Prices",
    "estimate",
    "prices_for",
]

PRICES_SOURCE = "https://cloud.google.com/storage/pricing"
PRICES_DATE = "2026-12-01"

_GIB = float(1 << 30)
_HOURS_PER_MONTH = 730.0  # how the pricing page turns GiB-hours into GiB-months
DAY_S = 86400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Prices:
    """List prices of one storage class in one location type, in US dollars.

    Attributes:
        class_a_per_1000: Per 1,000 class A operations.
        class_b_per_1000: Per 1,000 class B operations.
        storage_gib_month: Per GiB stored for a month (730 hours).
        retrieval_per_gib: Per GiB read (Nearline, Coldline, Archive).
        min_storage_days: Minimum storage duration billed for an object
            deleted sooner (0 for Standard).
    """

    class_a_per_1000: float
    class_b_per_1000: float
    storage_gib_month: float
    retrieval_per_gib: float = 0.0
    min_storage_days: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "class_a_per_1000",
            "class_b_per_1000",
            "storage_gib_month",
            "retrieval_per_gib",
            "min_storage_days",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"Prices.{name} must be >= 0, got {getattr(self, name)!r}")


#: (location type, storage class) -> list prices; see the module docstring.
PRICES: Mapping[tuple[str, str], Prices] = {
    ("region", "STANDARD"): Prices(
        class_a_per_1000=0.005, class_b_per_1000=0.0004, storage_gib_month=0.020
    ),
    ("region", "NEARLINE"): Prices(
        class_a_per_1000=0.010,
        class_b_per_1000=0.001,
        storage_gib_month=0.010,
        retrieval_per_gib=0.01,
        min_storage_days=30,
    ),
    ("region", "COLDLINE"): Prices(
        class_a_per_1000=0.020,
        class_b_per_1000=0.010,
        storage_gib_month=0.004,
        retrieval_per_gib=0.02,
        min_storage_days=90,
    ),
    ("region", "ARCHIVE"): Prices(
        class_a_per_1000=0.050,
        class_b_per_1000=0.050,
        storage_gib_month=0.0012,
        retrieval_per_gib=0.05,
        min_storage_days=365,
    ),
    ("multi-region", "STANDARD"): Prices(
        class_a_per_1000=0.010, class_b_per_1000=0.0004, storage_gib_month=0.026
    ),
    ("multi-region", "NEARLINE"): Prices(
        class_a_per_1000=0.020,
        class_b_per_1000=0.001,
        storage_gib_month=0.015,
        retrieval_per_gib=0.01,
        min_storage_days=30,
    ),
    ("multi-region", "COLDLINE"): Prices(
        class_a_per_1000=0.040,
        class_b_per_1000=0.010,
        storage_gib_month=0.007,
        retrieval_per_gib=0.02,
        min_storage_days=90,
    ),
    ("multi-region", "ARCHIVE"): Prices(
        class_a_per_1000=0.100,
        class_b_per_1000=0.050,
        storage_gib_month=0.0024,
        retrieval_per_gib=0.05,
        min_storage_days=365,
    ),
}


def prices_for(location_type: str = "region", storage_class: str = "STANDARD") -> Prices:
    """The list prices of :data:`PRICES` for a location type and storage class.

    Raises:
        ConfigError: No such entry (location types: ``region``,
            ``multi-region``; classes: STANDARD, NEARLINE, COLDLINE, ARCHIVE).
    """
    key = (location_type.lower(), storage_class.upper())
    found = PRICES.get(key)
    if found is None:
        raise ConfigError(
            f"no list prices for location type {location_type!r} and storage class "
            f"{storage_class!r}; known: {sorted(PRICES)} (pass Prices(...) instead)"
        )
    return found


@dataclass(frozen=True, kw_only=True, slots=True)
class CostEstimate:
    """What some requests (and retained bytes) cost at given prices, in US dollars."""

    class_a: int
    class_b: int
    free: int
    bytes_read: int
    retained_bytes: int
    retained_days: float
    operations_usd: float
    retrieval_usd: float
    retained_storage_usd: float
    prices: Prices

    @property
    def total_usd(self) -> float:
        """Operations, retrieval and retained storage together."""
        return self.operations_usd + self.retrieval_usd + self.retained_storage_usd

    def summary(self) -> str:
        """One line for a report."""
        line = (
            f"${self.total_usd:.4f} at list prices: {self.class_a:,} class A + "
            f"{self.class_b:,} class B ops ${self.operations_usd:.4f}"
        )
        if self.retrieval_usd:
            line += f", retrieval ${self.retrieval_usd:.4f}"
        if self.retained_bytes:
            line += (
                f", {self.retained_bytes / _GIB:,.2f} GiB of deleted composites kept "
                f"{self.retained_days:g} days ${self.retained_storage_usd:.4f}"
            )
        return line


def estimate(
    stats: RequestStats,
    *,
    location_type: str = "region",
    storage_class: str = "STANDARD",
    prices: Prices | None = None,
    retained_bytes: int = 0,
    retention_seconds: float = 0.0,
) -> CostEstimate:
    """The cost of ``stats`` at list prices.

    Args:
        stats: Requests and bytes (an :mod:`~torchbucket.accounting` snapshot
            or difference).
        location_type: ``"region"`` or ``"multi-region"``. Default region.
        storage_class: STANDARD, NEARLINE, COLDLINE or ARCHIVE. Default STANDARD.
        prices: Prices to use instead of :data:`PRICES`.
        retained_bytes: Bytes written and deleted (composites) that the bucket
            keeps: billed for the longer of ``retention_seconds`` and the
            class's minimum storage duration.
        retention_seconds: The bucket's soft-delete retention (0: off).
    """
    p = prices if prices is not None else prices_for(location_type, storage_class)
    days = max(retention_seconds / DAY_S, p.min_storage_days) if retained_bytes else 0.0
    return CostEstimate(
        class_a=stats.class_a,
        class_b=stats.class_b,
        free=stats.free,
        bytes_read=stats.bytes_in,
        retained_bytes=retained_bytes,
        retained_days=days,
        operations_usd=stats.class_a * p.class_a_per_1000 / 1000
        + stats.class_b * p.class_b_per_1000 / 1000,
        retrieval_usd=stats.bytes_in / _GIB * p.retrieval_per_gib,
        retained_storage_usd=retained_bytes
        / _GIB
        * p.storage_gib_month
        * days
        * 24
        / _HOURS_PER_MONTH,
        prices=p,
    )
