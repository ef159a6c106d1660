"""What an epoch of a dataset asks of the store, counted by the read path's own rules.

For ``torchbucket cost`` (:mod:`torchbucket.cost`). The iterable dataset's
epoch is cut as its prefetch windows cut it: each rank's and worker's part of
the order (``shard_of``), its first objects read directly (``direct_first``:
``min(64, reads_in_flight, objects // 4)``), the rest in compose groups planned by
the compose planner (``plan_groups``, with the anchor's source taken), and
large objects read in ranges (``object_gets``). A change to any of those rules
changes the estimate with it.

The estimate assumes compose is allowed on the bucket (no soft delete, or
``ComposeConfig(allow_with_soft_delete=True)``), no gzip objects, and every
compose path answered in time (none read around).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torchbucket.compose import ComposeConfig
from torchbucket.datasets._receive import object_gets
from torchbucket.datasets._units import plan_sizes, window_compose, window_units
from torchbucket.datasets.config import FetchConfig, ShardingConfig
from torchbucket.datasets.sharding import shard_of
from torchbucket.runtime.accounting import RequestStats

__all__ = ["EpochEstimate", "group_objects", "iterable_epoch", "map_epoch"]


@dataclass(frozen=True, slots=True)
class EpochEstimate:
    """One epoch's requests, and the bytes it writes as composites (then deletes)."""

    requests: RequestStats
    composite_bytes: int = 0


def group_objects(compose: ComposeConfig) -> tuple[int, bool]:
    """The most objects a prefetch window's composed group holds, and whether it has an anchor."""
    grouped, anchored = window_compose(compose)
    return grouped.max_sources, anchored


def _ops(**ops: int) -> dict[str, int]:
    return {k: v for k, v in ops.items() if v}


def map_epoch(sizes: Sequence[int], fetch: FetchConfig | None = None) -> EpochEstimate:
    """Direct reads: compose off, or ``BucketMapDataset`` batch at a time.

    (A map-style dataset reads batch at a time with a sampler it cannot read
    ahead of; reading ahead, it composes as :func:`iterable_epoch` counts.)
    """
    fetch = fetch if fetch is not None else FetchConfig()
    gets = sum(object_gets(int(size), fetch) for size in sizes)
    return EpochEstimate(RequestStats(by_op=_ops(get=gets), bytes_in=int(sum(sizes))))


def _window(sizes: list[int], fetch: FetchConfig, compose: ComposeConfig) -> dict[str, int]:
    """The requests of one prefetch window over objects of these sizes, from its start."""
    compose, anchored = window_compose(compose)

    def plan(start: int, stop: int) -> list[range]:
        return plan_sizes(sizes[start:stop], compose)

    ops = dict.fromkeys(("get", "compose", "delete", "put", "composite_bytes"), 0)
    for unit in window_units(len(sizes), 0, fetch, compose, plan):
        if len(unit) == 1:
            ops["get"] += object_gets(sizes[unit.start], fetch)
            continue
        # A group: compose (A), GET of the composite (B), its delete (free).
        ops["compose"] += 1
        ops["get"] += 1
        ops["delete"] += 1
        ops["composite_bytes"] += sum(sizes[unit.start : unit.stop])
    if anchored and ops["compose"]:
        ops["put"] += 1  # the anchor's upload; its delete is free
        ops["delete"] += 1
    return ops


def iterable_epoch(
    sizes: Sequence[int],
    *,
    ranks: int = 1,
    workers: int = 0,
    fetch: FetchConfig | None = None,
    compose: ComposeConfig | None = None,
    sharding: ShardingConfig | None = None,
) -> EpochEstimate:
    """One epoch of ``BucketIterableDataset`` in listing order, over all ranks and workers.

    Args:
        sizes: The objects' sizes, in listing order.
        ranks: DDP ranks.
        workers: DataLoader workers per rank (0: the main process reads).
        fetch: As the dataset's; default ``FetchConfig()``.
        compose: As the dataset's; default ``ComposeConfig()`` (on).
        sharding: As the dataset's; default ``ShardingConfig()``.
    """
    fetch = fetch if fetch is not None else FetchConfig()
    compose = compose if compose is not None else ComposeConfig()
    sharding = sharding if sharding is not None else ShardingConfig()
    all_sizes = np.asarray(sizes, dtype=np.int64)
    order = np.arange(len(all_sizes), dtype=np.int64)
    num_workers = max(workers, 1)
    totals: dict[str, int] = {}
    read = 0
    for rank in range(ranks):
        for worker in range(num_workers):
            mine = shard_of(
                order,
                rank=rank,
                world_size=ranks,
                worker=worker,
                num_workers=num_workers,
                uneven=sharding.uneven,
            )
            part = all_sizes[mine].tolist()
            read += sum(part)
            for op, n in _window(part, fetch, compose).items():
                totals[op] = totals.get(op, 0) + n
    composite_bytes = totals.pop("composite_bytes", 0)
    stats = RequestStats(by_op=_ops(**totals), bytes_in=read)
    return EpochEstimate(stats, composite_bytes)
