"""Fetching objects of a catalog: a batch at once, or an ordered prefetch window.

Both run on the runtime's loop and hand back raw bytes (or the error reading
each object raised); ``data_format_fn`` runs in the caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence

from torchbucket import runtime
from torchbucket.compose import ComposeConfig, compose_allowed, fetch_group, plan_groups
from torchbucket.compose import read_verified as _read_verified
from torchbucket.datasets._catalog import Catalog
from torchbucket.datasets._sharding import IndexArray
from torchbucket.datasets.config import FetchConfig

__all__ = ["PrefetchWindow", "fetch_batch", "plan_units"]

Item = bytes | BaseException

# The window plans compose groups this many positions at a time, so an epoch's
# first object does not wait for a plan of the whole shard.
_PLAN_CHUNK = 2048


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
            for group in plan_groups(
                sizes,
                max_composite_object_size=compose.max_composite_object_size,
                max_sources=compose.max_sources,
            ):
                units.append(range(start + group.start, start + group.stop))
        else:
            units.extend(range(i, i + 1) for i in range(start, stop))
        start = stop
    return units


async def _fetch_unit(
    catalog: Catalog, indices: Sequence[int], compose: ComposeConfig
) -> list[Item]:
    store = catalog.store(indices[0])
    if len(indices) == 1:
        try:
            return [await _read_verified(store, catalog.info(indices[0]))]
        except Exception as exc:  # handed to the consumer, raised there in order
            return [exc]
    try:
        return await fetch_group(store, [catalog.info(i) for i in indices], compose)
    except Exception as exc:  # the same: a prefetch window would otherwise wait forever
        return [exc] * len(indices)


async def fetch_batch(
    catalog: Catalog, indices: Sequence[int], compose: ComposeConfig
) -> list[Item]:
    """Fetch the objects at ``indices`` concurrently, composing small ones.

    Returns:
        Per index, its bytes or the error reading it raised.
    """
    units = plan_units(catalog, indices, compose)
    results = await asyncio.gather(
        *(_fetch_unit(catalog, [indices[p] for p in unit], compose) for unit in units)
    )
    if len(units) == len(indices):
        return [r[0] for r in results]
    return [item for unit_items in results for item in unit_items]


class PrefetchWindow:
    """An ordered window of fetches over one shard, with bounded memory.

    A producer on the runtime loop launches fetches ahead of the consumer while
    fewer than ``prefetch`` objects (and ``prefetch_bytes``) are requested and
    not yet taken; results are taken in shard order from another thread with
    :meth:`take`. The producer sleeps when the window is full and is woken once
    a quarter of it is free (or it is empty), so the two threads talk about
    once per quarter window, not once per object.

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
        self._start = start
        self._limit = fetch.prefetch
        self._limit_bytes = fetch.prefetch_bytes
        self._compose = compose
        self._cond = threading.Condition(threading.Lock())
        self._results: dict[int, Item] = {}
        self._waiting_for = -1
        self._outstanding = 0
        self._outstanding_bytes = 0
        self._producer_waiting = False
        self._resume_objects = 0
        self._resume_bytes = 0
        self._failure: BaseException | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: concurrent.futures.Future[None] | None = None

    def start(self) -> None:
        """Start the producer on the runtime loop."""
        if self._future is None:
            self._future = runtime.submit(self._produce())

    def close(self) -> None:
        """Stop fetching; in-flight composites are still deleted."""
        future = self._future
        if future is not None and not future.done():
            future.cancel()

    def take(self, pos: int) -> Item:
        """Wait for the object at ``pos`` (positions are taken in order)."""
        with self._cond:
            while pos not in self._results:
                if self._failure is not None:
                    raise self._failure
                self._waiting_for = pos
                self._cond.wait()
            self._waiting_for = -1
            item = self._results.pop(pos)
            self._outstanding -= 1
            self._outstanding_bytes -= int(self._catalog.sizes[self._order[pos]])
            if self._producer_waiting and (
                self._outstanding == 0
                or (
                    self._outstanding <= self._resume_objects
                    and self._outstanding_bytes <= self._resume_bytes
                )
            ):
                self._producer_waiting = False
                assert self._loop is not None and self._wake is not None
                self._loop.call_soon_threadsafe(self._wake.set)
        return item

    async def _admit(self, count: int, nbytes: int) -> None:
        assert self._wake is not None
        while True:
            with self._cond:
                if self._outstanding == 0 or (
                    self._outstanding + count <= self._limit
                    and self._outstanding_bytes + nbytes <= self._limit_bytes
                ):
                    self._outstanding += count
                    self._outstanding_bytes += nbytes
                    return
                self._resume_objects = self._limit - max(count, self._limit // 4)
                self._resume_bytes = self._limit_bytes - nbytes
                self._producer_waiting = True
                self._wake.clear()
            await self._wake.wait()

    def _deliver(self, first: int, items: list[Item]) -> None:
        with self._cond:
            for k, item in enumerate(items):
                self._results[first + k] = item
            if first <= self._waiting_for < first + len(items):
                self._cond.notify()

    async def _run_unit(self, first: int, indices: list[int]) -> None:
        self._deliver(first, await _fetch_unit(self._catalog, indices, self._compose))

    async def _produce(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        sizes = self._catalog.sizes
        try:
            pos = self._start
            while pos < len(self._order):
                chunk = self._order[pos : pos + _PLAN_CHUNK].tolist()
                for unit in plan_units(self._catalog, chunk, self._compose):
                    indices = chunk[unit.start : unit.stop]
                    await self._admit(len(indices), int(sizes[indices].sum()))
                    task = self._loop.create_task(self._run_unit(pos + unit.start, indices))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                pos += len(chunk)
            while tasks:
                await asyncio.wait(set(tasks))
        except BaseException as exc:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not isinstance(exc, asyncio.CancelledError):
                with self._cond:
                    self._failure = exc
                    self._cond.notify_all()
            raise
