"""Plans per read strategy: the features' own request counts, priced.

The counts come from the features (:mod:`torchbucket.datasets.estimate`,
:mod:`torchbucket.shards.estimate`), which cut an epoch by the same functions
their readers fetch by; this module adds what is done once per run (listing,
packing, opening) and prices it all. Those features import torch: they are
imported when a plan is asked for, not with :mod:`torchbucket.cost`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchbucket.errors import ConfigError
from torchbucket.runtime.accounting import RequestStats
from torchbucket.runtime.prices import DAY_S, CostEstimate, Prices, estimate, prices_for

if TYPE_CHECKING:
    from torchbucket.compose import ComposeConfig
    from torchbucket.datasets import FetchConfig
    from torchbucket.shards import PackConfig, ShardReadConfig

__all__ = ["StrategyPlan", "plan_strategies"]


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


def _times(stats: RequestStats, n: int) -> RequestStats:
    return RequestStats(
        by_op={k: v * n for k, v in stats.by_op.items()},
        bytes_in=stats.bytes_in * n,
        bytes_out=stats.bytes_out * n,
    )


@dataclass(frozen=True, slots=True)
class _Run:
    epochs: int
    prices: Prices
    retention: float

    def plan(
        self,
        strategy: str,
        epoch: RequestStats,
        once: RequestStats,
        retained: int = 0,
        note: str = "",
    ) -> StrategyPlan:
        run = once + _times(epoch, self.epochs)
        r, p = self.retention, self.prices
        return StrategyPlan(
            strategy=strategy,
            per_epoch=epoch,
            once=once,
            epoch=estimate(epoch, retained_bytes=retained, retention_seconds=r, prices=p),
            run=estimate(run, retained_bytes=retained * self.epochs, retention_seconds=r, prices=p),
            note=note,
        )


def _compose_note(
    compose: ComposeConfig, fetch: FetchConfig, soft_delete_seconds: int | None
) -> str:
    from torchbucket.datasets import estimate as datasets_estimate

    objects, anchored = datasets_estimate.group_objects(compose)
    note = (
        f"per worker, the first min(64, reads_in_flight={fetch.reads_in_flight}, objects/4)"
        f" read directly, then groups of <= {objects} objects"
        f"{' (and the window anchor)' if anchored else ''}"
        f" up to {compose.max_composite_object_size / (1 << 20):g} MiB"
    )
    if soft_delete_seconds:
        note += (
            f"; the bucket keeps deleted objects {soft_delete_seconds / DAY_S:g} days, so compose"
            " is OFF by default there: the cost shown is with"
            " ComposeConfig(allow_with_soft_delete=True)"
        )
    elif soft_delete_seconds is None:
        note += "; soft-delete policy unknown (403): modelled as off"
    return note


def _shards_plan(
    run: _Run,
    sizes: Sequence[int],
    listing: RequestStats,
    ranks: int,
    workers: int,
    pack: PackConfig | None,
    shard_read: ShardReadConfig | None,
) -> StrategyPlan:
    try:
        from torchbucket.shards import PackConfig, ShardReadConfig
        from torchbucket.shards import estimate as shards_estimate
    except ImportError:
        empty = RequestStats()
        return run.plan(
            "shards", empty, empty, note="torchbucket.shards is not available in this installation"
        )
    pack = pack if pack is not None else PackConfig()
    read = shard_read if shard_read is not None else ShardReadConfig()
    planned = shards_estimate.planned_shards(sizes, pack)
    opened = shards_estimate.open_requests(planned)
    once = listing + shards_estimate.pack_requests(planned, pack) + _times(opened, ranks)
    epoch = shards_estimate.epoch_requests(planned, ranks=ranks, workers=workers, shard_read=read)
    note = (
        f"packed once into {len(planned)} shard(s) of <= {pack.shard_size / (1 << 20):g} MiB"
        f" (torchbucket pack), read in ranges of {read.first_range_size / (1 << 20):g} MiB"
        f" doubling to {read.range_size / (1 << 20):g} MiB"
    )
    return run.plan("shards", epoch, once, note=note)


def _direct_plan(
    run: _Run, sizes: Sequence[int], listing: RequestStats, fetch: FetchConfig
) -> StrategyPlan:
    from torchbucket.datasets import estimate as datasets_estimate

    direct = datasets_estimate.map_epoch(sizes, fetch)
    return run.plan(
        "direct",
        direct.requests,
        listing,
        note=(
            "one GET per object (compose off, or the map-style dataset with a "
            "sampler it cannot read ahead of); from "
            f"{fetch.large_object_size / (1 << 20):g} MiB, one per "
            f"{fetch.range_size / (1 << 20):g} MiB range"
        ),
    )


def _compose_plan(
    run: _Run,
    sizes: Sequence[int],
    listing: RequestStats,
    *,
    ranks: int,
    workers: int,
    fetch: FetchConfig,
    compose: ComposeConfig,
    soft_delete_seconds: int | None,
) -> StrategyPlan:
    from torchbucket.datasets import estimate as datasets_estimate

    composed = datasets_estimate.iterable_epoch(
        sizes, ranks=ranks, workers=workers, fetch=fetch, compose=compose
    )
    # Each rank's process reads the bucket's soft-delete policy once (its
    # DataLoader workers inherit the answer).
    policy = RequestStats(by_op={"bucket_get": ranks} if compose.enabled else {})
    return run.plan(
        "compose",
        composed.requests,
        listing + policy,
        composed.composite_bytes,
        _compose_note(compose, fetch, soft_delete_seconds),
    )


# The public API: every option keyword-only, the run's shape and one config per
# strategy, each defaulting to the feature's own (a bundle would be a config of configs).
def plan_strategies(  # noqa: PLR0913
    sizes: Sequence[int],
    *,
    epochs: int,
    ranks: int = 1,
    workers: int = 1,
    prices: Prices | None = None,
    soft_delete_seconds: int | None = 0,
    listing_requests: int | None = None,
    fetch: FetchConfig | None = None,
    compose: ComposeConfig | None = None,
    pack: PackConfig | None = None,
    shard_read: ShardReadConfig | None = None,
) -> list[StrategyPlan]:
    """Model each read strategy's requests and cost over a run.

    ``direct``: compose off (or ``BucketMapDataset`` read batch at a time, with
    a sampler it cannot read ahead of). ``compose``: the datasets' default,
    compose on in a prefetch window (``BucketIterableDataset``, and
    ``BucketMapDataset`` reading ahead).
    ``shards``: ``torchbucket pack`` once, then ``BucketShardDataset``. Each
    is counted by the feature's own rules and its configs (defaults where
    ``None``), in listing order.

    Args:
        sizes: The listed objects' sizes.
        epochs: Epochs of the run.
        ranks: DDP ranks.
        workers: DataLoader workers per rank (0 counts as 1: the main process).
        prices: Default: ``prices_for()`` (Standard, region).
        soft_delete_seconds: The bucket's soft-delete retention (``None``:
            unknown, modelled as off): deleted composites are billed for it.
        listing_requests: The list requests one listing of the prefix took
            (as counted); default one per 1,000 objects (a parallel listing
            takes a few more).
        fetch: The datasets' ``FetchConfig``.
        compose: The iterable dataset's ``ComposeConfig``.
        pack: ``PackConfig`` of the pack.
        shard_read: ``ShardReadConfig`` of the shard dataset.

    Raises:
        ConfigError: ``epochs`` < 1, ``ranks`` < 1 or ``workers`` < 0.
    """
    if epochs < 1 or ranks < 1 or workers < 0:
        raise ConfigError(
            f"epochs and ranks must be >= 1 and workers >= 0, got {epochs}, {ranks}, {workers}"
        )
    from torchbucket.compose import ComposeConfig
    from torchbucket.datasets import FetchConfig

    fetch = fetch if fetch is not None else FetchConfig()
    compose = compose if compose is not None else ComposeConfig()
    n = len(sizes)
    pages = max(1, math.ceil(n / 1000)) if listing_requests is None else listing_requests
    listing = RequestStats(by_op={"list": pages} if pages else {})
    run = _Run(epochs, prices if prices is not None else prices_for(), soft_delete_seconds or 0)

    plans = [
        _direct_plan(run, sizes, listing, fetch),
        _compose_plan(
            run,
            sizes,
            listing,
            ranks=ranks,
            workers=workers,
            fetch=fetch,
            compose=compose,
            soft_delete_seconds=soft_delete_seconds,
        ),
    ]
    plans.append(_shards_plan(run, sizes, listing, ranks, workers, pack, shard_read))
    return plans
