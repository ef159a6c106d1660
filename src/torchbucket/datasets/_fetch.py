"""Fetching objects of a catalog through an ordered prefetch window (a batch at once: ``_batch``).

Both run on the runtime's loop and hand back each object's bytes, or the
tensor it was received into (``FetchConfig.output``; see ``_receive``), or the
error reading it raised; ``data_format_fn`` runs in the caller's thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
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
    plan_units,
    window_compose,
    window_depth,
    window_units,
)
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig
from torchbucket.datasets.sharding import IndexArray
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage.batch import ReadBatch, read_batch

__all__ = ["PrefetchWindow"]

# At DEBUG, a prefetch window logs its timeline: its start, each unit's fetch
# and each wait of its consumer (benchmarks/window_timeline.py reads them).
logger = logging.getLogger(__name__)

# A waiting consumer is woken once this many results are ready in order (or
# every admitted one has arrived): one thread hand-off per chunk, not per
# object. At most a quarter of the objects the window holds: where it holds
# fewer than a chunk (8 at 16 MiB, 2 at 64 MiB), the consumer slept until the
# last admitted object arrived, and no read began meanwhile (the iterable
# under the tail: 16.2 -> 17.8 samples/s at 64 MiB, sizes.py). One that takes
# what there is (the iterable's; a map-style batch waits for its own end) is
# also woken where the results in order end at a composed group in flight,
# all there is until that group's path ends: chunks of 32 and groups of 31
# had it wait for two groups, and an epoch's first batch for the first
# compose path (16 KiB: 0.30 s to the first batch in 7 of 10 epochs, 0.11-0.16 s
# after).
_HANDOVER_CHUNK = 32

# Reading directly, the read of an object the consumer waits for (the first of
# its chunk not arrived) is a straggler once this many objects after it have
# arrived, or an eighth of the objects the window holds, at least 2, and it
# has run _STRAGGLER_TIMES the median of the window's recent reads: it is then
# hedged (HedgeConfig.floor at least) without waiting out its size class's
# wait. Overtaking alone says little where the window holds few objects: at
# 16 MiB (8 a window, 2 overtakers) the latency tail's jitter reorders reads
# that run alongside, and 9-17 of an epoch's 256 ranged GETs were hedged
# after 0.09-0.2 s, inside the 0.18-0.27 s their own wait allowed.
_OVERTAKEN = 16
_STRAGGLER_TIMES = 2.0
# The window's recent direct reads timed for that median, and how many it
# needs first (until then a read waits its own wait).
_RECENT_READS = 64
_RECENT_LEAST = 8

# With tensor output in a DataLoader worker, a window's objects read one by
# one are carved out of shared segments of about this many objects, within
# _SLAB_BYTES_MOST: a batch then hands the main process a few handles, not
# one per object (see ``_receive.SharedSlab``).
_SLAB_OBJECTS = 64
_SLAB_BYTES_MOST = 4 << 20


class PrefetchWindow:
    """An ordered window of fetches over one shard, with bounded memory.

    ``reads_in_flight`` fetcher coroutines on the runtime loop take the shard's
    units (one object, or a group to compose) in order and keep up to
    ``reads_in_flight`` requests in flight, of which ``reads_in_flight // 8``
    to ``// 2`` (at least 2; see ``_GROUP_BYTES_IN_FLIGHT``) composed groups. A
    unit is admitted while the window, from the first position not yet taken
    to the unit's end, spans at most ``_AHEAD_PER_FETCHER`` times as many
    objects as can be in flight and at most ``prefetch_size`` (a unit alone is
    always admitted). Results not yet taken count against the window, so
    memory stays bounded, but a slow consumer never drains the requests in
    flight below ``reads_in_flight`` until the window is full.

    The threads hand results over in chunks: :meth:`take` returns the results
    that have arrived in order from the position asked for, at most a chunk
    (what it returns leaves the window's bounds), with at most one lock
    acquisition; a waiting consumer is woken once a chunk is ready in order,
    everything admitted has arrived, or (taking what there is) the results
    end at a group in flight; the fetchers once a quarter of the window is free.

    A consumer that has to wait marks the composed groups in flight that hold
    what it waits for: their compose path is read around after
    ``read_around_needed_after`` (compose's tuning), sooner than a group still
    ahead of the consumer (see :func:`~torchbucket.compose.fetch_group`). An
    object read directly that it waits for (the first of its chunk not yet
    arrived, wherever in the chunk) is hedged (see ``HedgeConfig``; its
    budget still applies) once ``_OVERTAKEN`` objects after it have arrived
    and it has run twice the median of the window's recent reads.

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
        # Per bucket, the anchor every compose of this window names first, so a
        # drain can revoke a compose left running (compose/_anchor.py).
        compose, anchored = window_compose(compose)
        self._anchors: dict[str, Anchor] | None = {} if anchored else None
        self._compose = compose
        self._fetch = fetch
        self._fetchers = fetch.reads_in_flight
        # Bytes before each position of the shard: the window's bytes are a
        # difference, with no per-object accounting.
        cum = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(catalog.sizes[order], out=cum[1:])
        self._cum = cum
        mean = max(1.0, float(cum[-1]) / max(1, len(order)))
        depth = window_depth(fetch, compose, mean)
        self._groups = depth.groups
        self._ahead = depth.ahead
        self._limit_bytes = depth.limit_bytes
        self._slab: SharedSlab | None = None
        if fetch.output == "tensor":
            per_object = float(cum[-1]) / max(1, len(order)) + SharedSlab.ALIGN
            slab = int(min(_SLAB_BYTES_MOST, max(64 << 10, _SLAB_OBJECTS * per_object)))
            self._slab = SharedSlab(slab)
        self._cond = threading.Condition(threading.Lock())
        self._results: dict[int, Item] = {}
        # Written by the consumer only.
        self._taken, self._waiting_for = start, -1
        self._wake_at, self._wake_partial = start, True
        # Written by the fetchers only.
        self._admitted_end = start
        self._arrived_upto = start
        self._resume_at = -1
        self._start = start
        self._failure: BaseException | None = None
        self._room: asyncio.Event | None = None
        # Groups in flight: first position -> (end, set once the consumer waits). Loop thread only.
        self._groups_in_flight: dict[int, tuple[int, asyncio.Event]] = {}
        # Objects read directly, in flight: position -> their reads. Loop thread only.
        self._reads_in_flight: dict[int, ReadBatch] = {}
        held = min(self._ahead, self._limit_bytes // int(mean))
        self._chunk = max(1, min(_HANDOVER_CHUNK, fetch.reads_in_flight // 4, held // 4))
        self._overtaken = max(2, min(_OVERTAKEN, held // 8))
        # Seconds the recent objects read directly took, and their median:
        # whole objects (all of an object's ranges), which is what overtakes
        # and is overtaken, not the hedger's per-request size classes. Loop thread only.
        self._read_times: collections.deque[float] = collections.deque(maxlen=_RECENT_READS)
        self._read_median: float | None = None
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

        ``pos`` is the first position not yet taken. A wait ends once a chunk
        has arrived in order, or ``want`` results (a map-style batch's last
        ones), or everything admitted, or (no ``want``) all before a group in flight.
        """
        results = self._results
        if pos not in results:
            with self._cond:
                # Announced before looking, so a delivery cannot slip between
                # (the loop thread reads _wake_at once it sees _waiting_for).
                self._wake_at = pos + max(1, min(self._chunk, want or self._chunk))
                self._wake_partial = want is None
                self._waiting_for = pos
                loop = self._loop
                if loop is not None:
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
        """Mark the groups in flight holding positions ``pos:end`` as waited for.

        The object at ``pos`` (the consumer waits for it: it has not
        arrived), if read directly, is hedged early once it is overtaken.
        """
        for first, (stop, needed) in self._groups_in_flight.items():
            if first < end and pos < stop:
                needed.set()
        # What has arrived is past pos: the consumer has taken everything before it.
        self._hurry_read(pos, len(self._results))

    def _hurry_read(self, pos: int, past: int) -> None:
        """Hedge the read of ``pos`` once it has run twice the recent median, if ``past`` overtook it.

        Called while the consumer waits for ``pos``: the first position of its
        chunk not arrived (it sleeps until the whole chunk has). A read
        overtaken by many begun after it, and slower than most, is a straggler
        (a stall, the tail of the service's latency), not a slow link or a
        busy CPU, which slow every read alike; everything behind it waits for
        it, so its own wait (its size class's quantile, see HedgeConfig) is
        not waited out.
        """
        reads = self._reads_in_flight.get(pos)
        median = self._read_median
        if reads is not None and median is not None and past >= self._overtaken:
            reads.hurry(_STRAGGLER_TIMES * median)

    def _timed(self, seconds: float) -> None:
        """An object read directly took ``seconds``: update the recent median."""
        times = self._read_times
        times.append(seconds)
        if len(times) >= _RECENT_LEAST:
            self._read_median = sorted(times)[len(times) // 2]

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

    @contextlib.contextmanager
    def _reads_of(self, first: int, grouped: bool) -> Iterator[None]:
        """An object read directly is one batch of reads, known by its position."""
        if grouped:
            yield
            return
        with read_batch() as reads:
            self._reads_in_flight[first] = reads
            try:
                yield
            finally:
                del self._reads_in_flight[first]

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
        if p > waiting and (  # see _HANDOVER_CHUNK
            p >= self._wake_at
            or p >= self._admitted_end
            or (self._wake_partial and p in self._groups_in_flight)
        ):
            with self._cond:
                self._cond.notify()
        else:
            # The consumer still waits for p, its chunk's first gap; the
            # results from ``waiting`` to p are not past it.
            self._hurry_read(p, len(results) - (p - waiting))

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
                with self._reads_of(first, grouped):
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
            if not grouped:
                self._timed(time.monotonic() - began)
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
