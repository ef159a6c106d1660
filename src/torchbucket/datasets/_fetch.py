"""Fetching objects of a catalog through an ordered prefetch window (a batch at once: ``_batch``).

Both run on the runtime's loop and hand back each object's bytes, or the
tensor it was received into (``FetchConfig.output``; see ``_receive``), or the
error reading it raised; ``data_format_fn`` runs in the caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator

import numpy as np

from torchbucket import runtime
from torchbucket.compose import Anchor, ComposeConfig
from torchbucket.compose.registry import drain_also
from torchbucket.datasets._batch import Item, fetch_unit
from torchbucket.datasets._receive import (
    SharedSlab,
)
from torchbucket.datasets._units import (
    COMPOSE_BELOW,
    plan_units,
    window_compose,
    window_units,
)
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig
from torchbucket.datasets.sharding import IndexArray
from torchbucket.runtime.tasks import gather_or_cancel

__all__ = ["PrefetchWindow"]

# At DEBUG, a prefetch window logs its timeline: its start, each unit's fetch
# and each wait of its consumer (benchmarks/window_timeline.py reads them).
logger = logging.getLogger(__name__)

# A waiting consumer is woken once this many results are ready in order (or
# every admitted one has arrived): one thread hand-off per chunk, not per object.
_HANDOVER_CHUNK = 32

# Reading directly, the window runs at most this many times ``reads_in_flight`` objects
# ahead of the first one not taken. The consumer takes objects in order, so one
# slow read holds everything behind it; the further the window runs ahead, the
# longer a straggler can be waited out without the requests in flight running
# dry. Measured (benchmarks/dataloading.py --quick --datasets 10kib, 2 workers,
# medians of 3, same-region-tail latency): 2 -> 2,466 / 2,330 samples/s
# (map-style with BucketBatchSampler / iterable), 4 -> 3,084 / 3,329,
# 8 -> 3,283 / 3,514; under the constant preset all ~3,600-4,200. 4 takes most
# of the gain for 512 objects ahead (51 MiB of 100 KiB objects); prefetch_size
# still bounds the bytes.
_AHEAD_PER_FETCHER = 4

# With compose on, a window of ``reads_in_flight`` has ``reads_in_flight // 8`` to
# ``reads_in_flight // 2`` groups in flight (16 to 64 by default, of up to 32 objects):
# as many as fit in _GROUP_BYTES_IN_FLIGHT, and it runs ahead _AHEAD_PER_FETCHER
# times the objects of those groups, as far as _BYTES_AHEAD allows. Small
# objects get the deep window: a group's compose path is a write plus a GET
# (~60 ms at the median, several times that in the tail), and at 10 KiB a
# worker consumes ~190 groups/s, so a straggling group at the head of a shallow
# window held everything behind it. Measured (benchmarks/dataloading.py --quick
# --datasets 10kib, same-region-tail, 2 workers, BucketBatchSampler / iterable,
# medians of 3): 16 groups, 2 rounds ahead: 5,143 / 6,204 samples/s; 16, 4:
# 6,348 / 6,760; 32, 2: 7,447 / 8,276; 32, 4: 8,497 / 8,830 (the constant
# preset: ~9,200-9,400). With the defaults at ~20,000 samples/s (512 B,
# epochs of 32,000 objects: benchmarks/sizes.py), 32 groups no longer kept
# up: 64 took both defaults from 20,700-21,100 to 22,600-25,800 samples/s
# under the constant preset and from 16,500-17,100 to 19,600-21,800 under
# the tail (2 runs of 32, 4 of 64 in two A/Bs).
# From 64 KiB the byte bound keeps it under 64: 49 groups at 64 KiB, 24 from
# 128 KiB. It was 48 MiB (24 groups at 64 KiB, 16 from 128 KiB, each about
# 4 MiB), and on a VM where the defaults read 3,200-3,500 samples/s of 256
# KiB (~430 MB/s a worker) a group's path took 0.13-0.14 s at the median,
# its nominal 0.08 s plus the wait for a busy CPU: 16 groups were just what
# that rate needs (a worker's consumer waited for its window 0.8-1.2 s of
# each 1.9-2.2 s epoch under either preset, benchmarks/window_timeline.py),
# and the tail's longer paths starved it further. 96 MiB against 48 (2 A/Bs of
# 2 rounds, benchmarks/sizes.py --quick --sizes 64kib,256kib --only
# map_default,iter_default --repeats 3; map-style / iterable samples/s):
# under the tail 1.08 / 1.10 and 1.02 / 1.08 at 256 KiB, 1.11 / 1.12 and
# 1.08 / 1.11 at 64 KiB; under the constant preset 0.93-1.11x; the tail's
# slowdown (medians of 12-30 back-to-back pairs) 1.19-1.24 -> 1.08-1.18.
# 60-160 KiB objects (varied_sizes.py) 5,356 / 5,760 against 4,849 / 5,505.
# 25-40 MiB more RSS a worker. 128 MiB in flight (192 ahead) read no more,
# for 50 MiB more RSS.
_GROUPS_PER_PREFETCH = 8
_GROUPS_PER_PREFETCH_MOST = 2
_GROUP_BYTES_IN_FLIGHT = 96 << 20

# The window's bytes with ``FetchConfig(prefetch_size=None)``, whatever the
# read path (objects one by one, whole or with ranged GETs from
# ``large_object_size``, or composed groups; see FetchConfig.prefetch_size).
_BYTES_AHEAD = 128 << 20

# With tensor output in a DataLoader worker, a window's objects read one by
# one are carved out of shared segments of about this many objects, within
# _SLAB_BYTES_MOST: a batch then hands the main process a few handles, not
# one per object (see ``_receive.SharedSlab``).
_SLAB_OBJECTS = 64
_SLAB_BYTES_MOST = 4 << 20


class PrefetchWindow:
    """An ordered window of fetches over one shard, with bounded memory.

    ``reads_in_flight`` fetcher coroutines on the runtime loop take the shard's units
    (one object, or a group to compose) in order and keep up to ``reads_in_flight``
    requests in flight, of which ``reads_in_flight // 8`` to ``reads_in_flight // 2`` (at
    least 2; see ``_GROUP_BYTES_IN_FLIGHT``) composed groups. A unit is
    admitted while the window, from the first position not yet taken to the
    unit's end, spans at most ``_AHEAD_PER_FETCHER`` times as many objects as
    can be in flight (composing, see ``_GROUP_BYTES_IN_FLIGHT``) and at most
    ``prefetch_size`` (a unit alone in the window is always admitted). Results that have arrived but are not yet
    taken count against the window, so memory stays bounded, but a slow
    consumer never drains the requests in flight below ``reads_in_flight`` until the
    window is full.

    The threads hand results over in chunks: :meth:`take` returns the results
    that have arrived in order from the position asked for, at most a chunk
    (what it returns leaves the window's bounds, so the consumer's backlog
    stays a chunk), with at most one lock acquisition; a waiting consumer is
    woken once a chunk of results is ready in order (or everything admitted
    has arrived), and the fetchers are woken once a quarter of the window is
    free.

    A consumer that has to wait marks the composed groups in flight that hold
    what it waits for: their compose path is read around after
    ``read_around_needed_after`` (compose's tuning), sooner than a group still
    ahead of the consumer (see :func:`~torchbucket.compose.fetch_group`).

    Args:
        catalog: The objects.
        order: The shard: catalog indices in the order they are consumed.
        start: The first position of ``order`` to fetch (a resumed epoch).
        fetch: Window bounds.
        compose: Compose settings.
    """

    def __init__(
        self,
        catalog: Catalog,
        order: IndexArray,
        start: int,
        fetch: FetchConfig,
        compose: ComposeConfig,
    ) -> None:
        self._catalog = catalog
        self._order = order
        # Per bucket, the anchor every compose of this window names first, so
        # that a drain can revoke a compose left running instead of waiting
        # for its answer (see compose/_anchor.py); it takes one of a
        # compose's sources.
        compose, anchored = window_compose(compose)
        self._anchors: dict[str, Anchor] | None = {} if anchored else None
        self._compose = compose
        self._fetch = fetch
        self._fetchers = fetch.reads_in_flight
        self._ahead = _AHEAD_PER_FETCHER * fetch.reads_in_flight
        self._groups = 0
        # Bytes before each position of the shard: the window's bytes are a
        # difference, with no per-object accounting.
        cum = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(catalog.sizes[order], out=cum[1:])
        self._cum = cum
        mean = max(1.0, float(cum[-1]) / max(1, len(order)))
        if compose.enabled and mean < COMPOSE_BELOW:
            # Groups of up to max_sources objects: fewer requests in flight hide
            # the compose + GET latency for as many objects. (Objects of
            # COMPOSE_BELOW and more are read directly: no groups to size for.)
            group_bytes = min(compose.max_sources * mean, compose.max_composite_object_size)
            least = max(2, fetch.reads_in_flight // _GROUPS_PER_PREFETCH)
            most = max(least, fetch.reads_in_flight // _GROUPS_PER_PREFETCH_MOST)
            self._groups = max(least, min(most, int(_GROUP_BYTES_IN_FLIGHT // group_bytes)))
            rounds = _AHEAD_PER_FETCHER * self._groups * compose.max_sources
            # Objects not grouped (larger than the cap) still have ``reads_in_flight``
            # requests in flight.
            self._ahead = max(
                self._ahead,
                2 * self._groups * compose.max_sources,
                min(rounds, int(_BYTES_AHEAD // mean)),
            )
        self._slab: SharedSlab | None = None
        if fetch.output == "tensor":
            per_object = float(cum[-1]) / max(1, len(order)) + SharedSlab.ALIGN
            self._slab = SharedSlab(
                int(min(_SLAB_BYTES_MOST, max(64 << 10, _SLAB_OBJECTS * per_object)))
            )
        self._limit_bytes: int = (
            _BYTES_AHEAD if fetch.prefetch_size is None else fetch.prefetch_size
        )
        self._chunk = max(1, min(_HANDOVER_CHUNK, fetch.reads_in_flight // 4))
        self._cond = threading.Condition(threading.Lock())
        self._results: dict[int, Item] = {}
        # Written by the consumer only.
        self._taken = start
        self._waiting_for = -1
        self._wake_at = start
        # Written by the fetchers only.
        self._admitted_end = start
        self._arrived_upto = start
        self._resume_at = -1
        self._start = start
        self._failure: BaseException | None = None
        self._room: asyncio.Event | None = None
        # Groups in flight: first position -> (end, set once the consumer
        # waits for one of its objects). Loop thread only.
        self._groups_in_flight: dict[int, tuple[int, asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: concurrent.futures.Future[None] | None = None
        self._timeline = logger.isEnabledFor(logging.DEBUG)

    def start(self) -> None:
        """Start the fetchers on the runtime loop."""
        if self._future is None:
            self._future = runtime.submit(self._produce())

    def close(self) -> None:
        """Stop fetching; composites in flight are still deleted.

        Also has the window's anchors revoked, in a callback the runtime's
        loop runs before anything the caller submits after this call (a
        drain then waits for the revokes).
        """
        future = self._future
        if future is not None and not future.done():
            future.cancel()
        loop = self._loop
        if self._anchors and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._revoke_anchors)

    def _revoke_anchors(self) -> None:
        """Revoke the window's anchors, the drain waiting for it (loop thread only)."""
        for anchor in (self._anchors or {}).values():
            drain_also(anchor.revoke())

    def take(self, pos: int, want: int | None = None) -> list[Item]:
        """The results that have arrived in order from ``pos``: at least one, at most a chunk.

        Positions are taken in order: ``pos`` is the first position not yet
        taken. A call that has to wait is woken once a chunk has arrived in
        order, or ``want`` results (the caller needs no more: a map-style
        batch's last ones), or everything admitted.
        """
        results = self._results
        if pos not in results:
            with self._cond:
                # Announced before looking, so a delivery cannot slip between
                # (the loop thread reads _wake_at once it sees _waiting_for).
                self._wake_at = pos + max(1, min(self._chunk, want or self._chunk))
                self._waiting_for = pos
                loop = self._loop
                if loop is not None and self._compose.enabled:
                    loop.call_soon_threadsafe(self._hurry, pos, self._wake_at)
                began = time.monotonic()
                try:
                    while pos not in results:
                        if self._failure is not None:
                            raise self._failure
                        if not self._cond.wait(runtime.PARENT_CHECK_S):
                            gone = runtime.main_process_gone()
                            if gone is not None:
                                self.close()
                                raise RuntimeError(gone)
                finally:
                    self._waiting_for = -1
            if self._timeline:  # outside the lock
                logger.debug(
                    "window wait %.4f s for position %d, %d groups in flight",
                    time.monotonic() - began,
                    pos,
                    len(self._groups_in_flight),
                )
        # At most a chunk: what is handed over leaves the window's count, so
        # handing over everything that arrived would let the consumer's
        # backlog grow past the window's bounds (it did: 500+ objects).
        out: list[Item] = []
        p = pos
        stop = pos + self._chunk
        while p < stop and p in results:
            out.append(results.pop(p))
            p += 1
        self._taken = p
        resume = self._resume_at
        if 0 <= resume <= p:
            self._resume_at = -1
            assert self._loop is not None and self._room is not None
            self._loop.call_soon_threadsafe(self._room.set)
        return out

    def _hurry(self, pos: int, end: int) -> None:
        """Mark the groups in flight holding positions ``pos:end`` as waited for."""
        for first, (stop, needed) in self._groups_in_flight.items():
            if first < end and pos < stop:
                needed.set()

    def _fits(self, first: int, end: int) -> bool:
        taken = self._taken
        return first <= taken or (
            end - taken <= self._ahead
            and int(self._cum[end] - self._cum[taken]) <= self._limit_bytes
        )

    async def _admit(self, first: int, end: int) -> None:
        room = self._room
        assert room is not None
        while not self._fits(first, end):
            # Wake when a quarter of the window is free, or it is empty.
            by_count = end - self._ahead + self._ahead // 4
            by_bytes = int(np.searchsorted(self._cum, self._cum[end] - self._limit_bytes))
            room.clear()
            self._resume_at = min(first, max(by_count, by_bytes))
            if self._fits(first, end):
                self._resume_at = -1
                return
            await room.wait()
        self._admitted_end = end

    def _deliver(self, first: int, items: list[Item]) -> None:
        results = self._results
        for k, item in enumerate(items):
            results[first + k] = item
        waiting = self._waiting_for
        if waiting < 0:
            return
        p = max(self._arrived_upto, self._taken)
        while p in results:
            p += 1
        self._arrived_upto = p
        if p > waiting and (p >= self._wake_at or p >= self._admitted_end):
            with self._cond:
                self._cond.notify()

    def _units(self) -> Iterator[tuple[int, list[int]]]:
        order = self._order

        def plan(start: int, stop: int) -> list[range]:
            return plan_units(self._catalog, order[start:stop].tolist(), self._compose)

        for unit in window_units(len(order), self._start, self._fetch, self._compose, plan):
            yield unit.start, order[unit.start : unit.stop].tolist()

    async def _fetcher(
        self,
        units: Iterator[tuple[int, list[int]]],
        gate: asyncio.Lock,
        group_slots: asyncio.Semaphore,
    ) -> None:
        while True:
            async with gate:  # units are admitted in order, one fetcher at a time
                unit = next(units, None)
                if unit is None:
                    return
                first, indices = unit
                await self._admit(first, first + len(indices))
                grouped = len(indices) > 1
                needed = None
                if grouped:
                    await group_slots.acquire()
                    needed = asyncio.Event()
                    self._groups_in_flight[first] = (first + len(indices), needed)
                    if self._waiting_for >= 0:  # the consumer already waits
                        self._hurry(self._waiting_for, self._wake_at)
            began = time.monotonic()
            try:
                items = await fetch_unit(
                    self._catalog,
                    indices,
                    self._compose,
                    self._fetch,
                    self._slab,
                    needed,
                    self._anchors,
                )
            finally:
                if grouped:
                    del self._groups_in_flight[first]
                    group_slots.release()
            if self._timeline:
                logger.debug(
                    "window unit at position %d: %d objects in %.4f s%s",
                    first,
                    len(indices),
                    time.monotonic() - began,
                    ", waited for" if needed is not None and needed.is_set() else "",
                )
            self._deliver(first, items)
            # Not kept while this fetcher waits for its next unit: with many
            # fetchers waiting on a full window, their last groups' bytes
            # (up to reads_in_flight x 32 objects) were held outside its bounds.
            del items

    async def _produce(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._room = asyncio.Event()
        if self._timeline:
            logger.debug(
                "window start: %d objects from position %d, %d groups in flight at most",
                len(self._order) - self._start,
                self._start,
                self._groups,
            )
        units = self._units()
        gate = asyncio.Lock()
        remaining = len(self._order) - self._start
        group_slots = asyncio.Semaphore(max(1, self._groups))
        fetchers = [
            self._loop.create_task(self._fetcher(units, gate, group_slots))
            for _ in range(max(1, min(self._fetchers, remaining)))
        ]
        try:
            await gather_or_cancel(fetchers)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                with self._cond:
                    self._failure = exc
                    self._cond.notify_all()
            raise
        finally:
            # Every group has its bytes: what compose is still running was
            # read around. Revoked now, it can no longer make a composite, and
            # the drain that ends the epoch no longer waits for its answer.
            self._revoke_anchors()
            # The last results may have arrived while the consumer waited for
            # a whole chunk.
            with self._cond:
                self._cond.notify_all()
