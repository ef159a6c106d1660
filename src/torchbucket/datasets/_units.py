"""How a fetch is cut into units: one object read directly, or a group to compose.

Pure functions of the catalog, the order and the configs: the prefetch
window and ``fetch_batch`` fetch by them, and :mod:`torchbucket.datasets.estimate`
counts an epoch's requests by them (``torchbucket cost``), so the estimate
follows any change made here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

from torchbucket.compose import ComposeConfig, compose_allowed, plan_groups, window_anchored
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig

__all__ = [
    "COMPOSE_BELOW",
    "direct_first",
    "plan_sizes",
    "plan_units",
    "window_compose",
    "window_depth",
    "window_units",
]

# The window plans compose groups this many positions at a time, so an epoch's
# first object does not wait for a plan of the whole shard.
_PLAN_CHUNK = 2048


# With compose on, the first objects of a window are read directly: a compose
# and the GET of a whole group take about four times one GET's latency, and
# the first batch waits for them. At most this many objects, ``reads_in_flight``, or
# a quarter of the window's objects.
_DIRECT_START = 64


# Reading directly, the window runs at most this many times ``reads_in_flight``
# objects ahead of the first one not taken: the further ahead, the longer a
# straggler at its head is waited out with requests still in flight. At 10
# KiB under the tail (dataloading.py --quick, map-style / iterable): 2 ->
# 2,466 / 2,330 samples/s, 4 -> 3,084 / 3,329, 8 -> 3,283 / 3,514 (constant
# preset ~3,600-4,200). prefetch_size still bounds the bytes.
_AHEAD_PER_FETCHER = 4

# With compose on, a window of ``reads_in_flight`` has ``reads_in_flight // 8`` to
# ``reads_in_flight // 2`` groups in flight (16 to 64 by default, of up to 32 objects):
# as many as fit in _GROUP_BYTES_IN_FLIGHT, and it runs ahead _AHEAD_PER_FETCHER
# times the objects of those groups, as far as _BYTES_AHEAD allows. Small
# objects get the deep window: a group's compose path is a write plus a GET
# (~60 ms at the median, several times that in the tail), and at 10 KiB a
# worker consumes ~190 groups/s, so a straggling group at the head of a shallow
# window held everything behind it. Measured at 10 KiB under the tail
# (benchmarks/dataloading.py --quick --datasets 10kib, map-style / iterable):
# 16 groups, 2 rounds ahead: 5,143 / 6,204 samples/s; 32, 4: 8,497 / 8,830
# (the constant preset ~9,200-9,400). At 512 B (benchmarks/sizes.py) 64
# groups against 32: 20,700-21,100 -> 22,600-25,800 samples/s under the
# constant preset, 16,500-17,100 -> 19,600-21,800 under the tail.
# From 64 KiB the byte bound keeps it under 64: 49 groups at 64 KiB, 24 from
# 128 KiB. 96 MiB against the 48 it was: under the tail 1.02-1.12x the
# samples/s at 64 and 256 KiB, the constant preset 0.93-1.11x, 25-40 MiB
# more RSS a worker; 128 MiB read no more. At 48 MiB a group's path (0.13-0.14
# s at the median on a busy 2-core VM) outran 16 groups in flight, and each
# worker's consumer waited for its window about half of every epoch
# (docs/benchmarks.md, "A composing window's groups in flight").
_GROUPS_PER_PREFETCH = 8
_GROUPS_PER_PREFETCH_MOST = 2
_GROUP_BYTES_IN_FLIGHT = 96 << 20

# The window's bytes with ``FetchConfig(prefetch_size=None)``, whatever the
# read path (objects one by one, whole or with ranged GETs from
# ``large_object_size``, or composed groups; see FetchConfig.prefetch_size).
_BYTES_AHEAD = 128 << 20

# Objects of at least this many bytes are read directly, never composed.
# Compose trades up to 31 GETs for a compose, one GET and a delete; the larger
# the objects, the fewer GETs a composite saves and the longer its single
# stream. Measured on the emulator's same-region model, 2 DataLoader workers,
# compose below 256 KiB over below 64 KiB, alternated in one window on the
# 2-core VM at load 2-4 (docs/benchmarks.md, "Compose by size"): 100 KiB
# (dataloading.py) 1.5-2.7x the samples/s; 64 KiB (sizes.py) 1.13-1.23x, with
# 25% less client CPU per MiB; 256 KiB no difference beyond the noise. An
# earlier A/B at load 7-12 had compose losing from 64 KiB: there the
# composites' paths straggled on the starved CPU and 40-50% of the objects
# were also read around them (ComposeConfig.read_around_after). Since the
# raw-bytes hand-over copies nothing in the worker, compose also pays at 256
# KiB (sizes.py --sizes 256kib,1mib, defaults, same-region, medians of 2):
# map / iterable 2,789 / 2,829 samples/s composed against 2,227 / 2,267
# direct, at 1.6 against 2.5 ms of client CPU per MiB, and under the latency
# tail 2,200 / 2,056 against 1,617 / 1,668; at 1 MiB it loses (760 / 689
# composed, about 950 direct). The cut lies between the two sizes measured.
COMPOSE_BELOW = 512 << 10


def plan_sizes(sizes: list[int], compose: ComposeConfig) -> list[range]:
    """Units of consecutive objects of one store that compose is allowed on, by their sizes.

    Objects of :data:`COMPOSE_BELOW` bytes and more are units of their own.
    """
    if not compose.enabled or len(sizes) < 2:
        return [range(i, i + 1) for i in range(len(sizes))]
    over = compose.max_composite_object_size + 1  # a unit of its own
    sizes = [n if n < COMPOSE_BELOW else over for n in sizes]
    return plan_groups(
        sizes,
        max_composite_object_size=compose.max_composite_object_size,
        max_sources=compose.max_sources,
    )


def plan_units(catalog: Catalog, indices: Sequence[int], compose: ComposeConfig) -> list[range]:
    """Split ``indices`` into consecutive units: one object, or a group to compose.

    A group never spans two stores, and is planned only while compose is
    allowed on its store (not refused or throttled in this process).
    """
    n = len(indices)
    if not compose.enabled or n < 2:
        return [range(i, i + 1) for i in range(n)]
    units: list[range] = []
    start = 0
    while start < n:
        sid = catalog.store_id(indices[start])
        stop = start + 1
        while stop < n and catalog.store_id(indices[stop]) == sid:
            stop += 1
        if compose_allowed(catalog.stores[sid], compose):
            sizes = catalog.sizes[list(indices[start:stop])].tolist()
            if catalog.transcoded:
                # A gzip object's bytes in a composite are its stored, compressed
                # ones: read it directly (a size over the cap makes it a unit alone).
                for pos in range(start, stop):
                    if indices[pos] in catalog.transcoded:
                        sizes[pos - start] = compose.max_composite_object_size + 1
            for group in plan_sizes(sizes, compose):
                units.append(range(start + group.start, start + group.stop))
        else:
            units.extend(range(i, i + 1) for i in range(start, stop))
        start = stop
    return units


def window_compose(compose: ComposeConfig) -> tuple[ComposeConfig, bool]:
    """The compose settings a prefetch window plans with, and whether it has anchors.

    With anchors (:func:`~torchbucket.compose.window_anchored`), the anchor
    takes each compose's first source: groups hold ``max_sources - 1`` objects.
    """
    if window_anchored(compose):
        return dataclasses.replace(compose, max_sources=compose.max_sources - 1), True
    return compose, False


def direct_first(remaining: int, fetch: FetchConfig, compose: ComposeConfig) -> int:
    """How many of a window's ``remaining`` objects are read directly before any compose."""
    if not compose.enabled:
        return 0
    return min(_DIRECT_START, fetch.reads_in_flight, remaining // 4)


def window_units(
    count: int,
    start: int,
    fetch: FetchConfig,
    compose: ComposeConfig,
    plan: Callable[[int, int], Sequence[range]],
) -> Iterator[range]:
    """The units a window over positions ``[start, count)`` of a shard fetches, in order.

    The first :func:`direct_first` positions are units of one; the rest is
    planned ``_PLAN_CHUNK`` positions at a time by ``plan(first, stop)``, whose
    ranges count from ``first``. ``compose`` is the window's
    (:func:`window_compose`).
    """
    pos = start
    direct_end = pos + direct_first(count - pos, fetch, compose)
    while pos < count:
        stop = min(count, pos + _PLAN_CHUNK)
        head = max(0, min(direct_end - pos, stop - pos))
        for k in range(pos, pos + head):
            yield range(k, k + 1)
        first = pos + head
        if first < stop:
            for unit in plan(first, stop):
                yield range(first + unit.start, first + unit.stop)
        pos = stop


@dataclasses.dataclass(frozen=True, slots=True)
class WindowDepth:
    """How far a prefetch window runs ahead of its consumer.

    Attributes:
        groups: Composed groups in flight at most (0: nothing is composed).
        ahead: Objects from the first one not taken to the end of the last admitted.
        limit_bytes: Bytes of those objects, at most (a unit alone is always admitted).
    """

    groups: int
    ahead: int
    limit_bytes: int


def window_depth(fetch: FetchConfig, compose: ComposeConfig, mean: float) -> WindowDepth:
    """The depth of a window over objects of ``mean`` bytes on average."""
    ahead = _AHEAD_PER_FETCHER * fetch.reads_in_flight
    groups = 0
    if compose.enabled and mean < COMPOSE_BELOW:
        # Groups of up to max_sources objects: fewer requests in flight hide
        # the compose + GET latency for as many objects. (Objects of
        # COMPOSE_BELOW and more are read directly: no groups to size for.)
        group_bytes = min(compose.max_sources * mean, compose.max_composite_object_size)
        least = max(2, fetch.reads_in_flight // _GROUPS_PER_PREFETCH)
        most = max(least, fetch.reads_in_flight // _GROUPS_PER_PREFETCH_MOST)
        groups = max(least, min(most, int(_GROUP_BYTES_IN_FLIGHT // group_bytes)))
        rounds = _AHEAD_PER_FETCHER * groups * compose.max_sources
        # Objects not grouped (larger than the cap) still have
        # ``reads_in_flight`` requests in flight.
        ahead = max(ahead, 2 * groups * compose.max_sources, min(rounds, int(_BYTES_AHEAD // mean)))
    limit = _BYTES_AHEAD if fetch.prefetch_size is None else fetch.prefetch_size
    return WindowDepth(groups=groups, ahead=ahead, limit_bytes=limit)
