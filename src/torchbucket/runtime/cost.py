"""What requests and retained bytes cost at GCS list prices, and a plan per read strategy.

::

    from torchbucket import accounting, cost

    with accounting.measure() as m:
        for batch in loader:
            ...
    print(cost.estimate(m.stats).summary())

:data:`PRICES` (from :mod:`torchbucket.runtime.prices`) is the one price table: US dollars at Google's list prices for a
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from torchbucket.errors import ConfigError
from torchbucket.runtime.accounting import RequestStats
from torchbucket.runtime.prices import (
    DAY_S,
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


# ---------------------------------------------------------------- plans


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategyPlan:
    """The modelled requests and cost of one read strategy.

    Attributes:
        strategy: ``"direct"``, ``"compose"`` or ``"shards"``.
        per_epoch: Requests of one epoch (all ranks and workers).
        once: Requests made once per run (listing; packing for shards).
        epoch: Cost of one epoch.
        run: Cost of the whole run (``once`` plus every epoch).
        note: What the model assumes, or why the strategy is off.
    """

    strategy: str
    per_epoch: RequestStats
    once: RequestStats
    epoch: CostEstimate
    run: CostEstimate
    note: str = ""


def _ops(**ops: int) -> RequestStats:
    return RequestStats(by_op={k: v for k, v in ops.items() if v})


def _times(stats: RequestStats, n: int) -> RequestStats:
    return RequestStats(
        by_op={k: v * n for k, v in stats.by_op.items()},
        bytes_in=stats.bytes_in * n,
        bytes_out=stats.bytes_out * n,
    )


def _shards_of(count: int, parts: int) -> list[range]:
    """``count`` objects dealt round-robin over ``parts`` (rank x worker) shards."""
    return [range(i, count, parts) for i in range(parts)]


def compose_epoch(
    sizes: Sequence[int],
    *,
    parts: int,
    max_composite_object_size: int,
    max_sources: int = 32,
    direct_first: int = 64,
    anchor: bool = True,
) -> tuple[RequestStats, int]:
    """Requests and composite bytes of one compose epoch (iterable dataset's plan).

    Each of ``parts`` shards (ranks x workers) reads its first ``direct_first``
    objects directly, then groups consecutive objects up to the cap and
    ``max_sources`` per group (one less with ``anchor``: a shard that composes
    uploads an empty anchor, one insert (A), deleted at its end (free), and
    names it in every compose): a group of two or more is one compose (A), one
    GET (B) and one delete (free); a lone object or one over the cap is one GET.

    Returns:
        The requests, and the bytes written as composites (then deleted).
    """
    compose = get = delete = put = 0
    composite_bytes = 0
    if anchor and max_sources > 2:
        max_sources -= 1
    else:
        anchor = False
    for shard in _shards_of(len(sizes), parts):
        composed_before = compose
        group: list[int] = []

        def close(group: list[int]) -> None:
            nonlocal compose, get, delete, composite_bytes
            if len(group) >= 2:
                compose += 1
                delete += 1
                composite_bytes += sum(group)
            get += 1 if group else 0

        for k, i in enumerate(shard):
            size = sizes[i]
            if k < direct_first or size > max_composite_object_size:
                get += 1
                continue
            if len(group) == max_sources or sum(group) + size > max_composite_object_size:
                close(group)
                group = []
            group.append(size)
        close(group)
        if anchor and compose > composed_before:
            put += 1
            delete += 1
    stats = _ops(compose=compose, get=get, delete=delete, put=put)
    return replace(stats, bytes_in=sum(sizes)), composite_bytes


def plan_strategies(
    sizes: Sequence[int],
    *,
    epochs: int,
    ranks: int = 1,
    workers: int = 1,
    location_type: str = "region",
    storage_class: str = "STANDARD",
    prices: Prices | None = None,
    soft_delete_seconds: int | None = 0,
    max_composite_object_size: int = 4 << 20,
    shard_size: int = 256 << 20,
    shard_read_size: int = 32 << 20,
    part_size: int = 16 << 20,
    shards_available: bool = True,
    listing_requests: int | None = None,
) -> list[StrategyPlan]:
    """Model each read strategy's requests and cost over a run.

    Args:
        sizes: The listed objects' sizes.
        epochs: Epochs of the run.
        ranks: DDP ranks.
        workers: DataLoader workers per rank (0 counts as 1: the main process).
        location_type: See :func:`estimate`.
        storage_class: See :func:`estimate`.
        prices: See :func:`estimate`.
        soft_delete_seconds: The bucket's soft-delete retention (``None``:
            unknown, modelled as off).
        max_composite_object_size: Compose's cap (``ComposeConfig``).
        shard_size: ``PackConfig.shard_size``.
        shard_read_size: ``ShardReadConfig.read_size``.
        part_size: ``PackConfig.part_size``.
        shards_available: Whether ``torchbucket.shards`` is installed.
        listing_requests: The list requests one listing of the prefix took
            (as counted); default one per 1,000 objects (a parallel listing
            takes a few more).

    Raises:
        ConfigError: ``epochs`` < 1, ``ranks`` < 1 or ``workers`` < 0.
    """
    if epochs < 1 or ranks < 1 or workers < 0:
        raise ConfigError(
            f"epochs and ranks must be >= 1 and workers >= 0, got {epochs}, {ranks}, {workers}"
        )
    parts = ranks * max(workers, 1)
    n = len(sizes)
    total = sum(sizes)
    retention = soft_delete_seconds or 0
    pages = max(1, math.ceil(n / 1000)) if listing_requests is None else listing_requests
    listing = _ops(list=pages)
    p = prices if prices is not None else prices_for(location_type, storage_class)
    plans: list[StrategyPlan] = []

    def add(
        strategy: str,
        epoch: RequestStats,
        once: RequestStats,
        retained: int = 0,
        note: str = "",
    ) -> None:
        run = once + _times(epoch, epochs)
        plans.append(
            StrategyPlan(
                strategy=strategy,
                per_epoch=epoch,
                once=once,
                epoch=estimate(
                    epoch, retained_bytes=retained, retention_seconds=retention, prices=p
                ),
                run=estimate(
                    run, retained_bytes=retained * epochs, retention_seconds=retention, prices=p
                ),
                note=note,
            )
        )

    add("direct", replace(_ops(get=n), bytes_in=total), listing, note="one GET per object")

    epoch, composite_bytes = compose_epoch(
        sizes, parts=parts, max_composite_object_size=max_composite_object_size
    )
    # Each worker process reads the bucket's soft-delete policy once.
    epoch = epoch + _ops(bucket_get=parts)
    note = f"groups of <= 32 objects up to {max_composite_object_size >> 20} MiB"
    if retention:
        note += (
            f"; the bucket keeps deleted objects {retention / DAY_S:g} days, so compose is OFF by"
            " default there: the cost shown is with ComposeConfig(allow_with_soft_delete=True)"
        )
    elif soft_delete_seconds is None:
        note += "; soft-delete policy unknown (403): modelled as off"
    add("compose", epoch, listing, composite_bytes, note)

    if not shards_available:
        plans.append(
            StrategyPlan(
                strategy="shards",
                per_epoch=RequestStats(),
                once=RequestStats(),
                epoch=estimate(RequestStats(), prices=p),
                run=estimate(RequestStats(), prices=p),
                note="torchbucket.shards is not available in this installation",
            )
        )
        return plans
    shards = max(1, math.ceil(total / shard_size))
    per_shard = shard_size if shards > 1 else max(total, 1)
    mpu_parts = shards * max(1, math.ceil(per_shard / part_size))
    pack = _ops(
        list=pages,
        get=n,
        mpu_initiate=shards,
        mpu_part=mpu_parts,
        mpu_complete=shards,
        put=shards + 1,  # an index per shard, and the manifest
    )
    # Ranged reads of read_size, one more per shard boundary, and each
    # worker's first reads ramping up from first_read_size (1 MiB doubling to
    # the 32 MiB default: 5 reads before the first full one).
    ramp = max(0, (shard_read_size >> 20).bit_length() - 1)
    reads = math.ceil(total / shard_read_size) + shards + ramp * parts
    shard_epoch = replace(_ops(get=reads), bytes_in=total)
    add(
        "shards",
        shard_epoch,
        pack + _ops(list=1, get=1),  # the packed set's listing and manifest
        note=(
            f"packed once into {shards} shard(s) of <= {shard_size >> 20} MiB "
            f"(torchbucket pack), read in {shard_read_size >> 20} MiB ranges"
        ),
    )
    return plans
