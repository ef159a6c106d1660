"""The parallel lister: asyncio work stealing over key ranges of one prefix.

One listing job, on one event loop. The first page is fetched plainly; when it
says there is no more, the listing cost one request. Otherwise the rest of the
prefix's key space, ``(last name of page 1, end of prefix)``, is one range, and
listers take pieces of it:

- Each lister drains one range at a time with ``start_offset``/``end_offset``
  page requests, following page tokens while its end stays put.
- A lister without a range steals from the range with the most estimated work
  left. A bounded range is cut half way between where its lister will be once
  its request in flight returns and its end. The top range (no end; it runs to
  the end of the prefix, wherever that is) is cut a few pages ahead of its
  lister: the victim keeps a bounded range, the thief becomes the new top.
- Estimates come from names seen: a range's density (names per unit of key
  space, see :mod:`torchbucket._keyspace`) from its own pages or from the range
  it was cut from. A wrong estimate costs time or a request, never a name.
- The number of listers grows as pages come back full, like TCP's slow start,
  so a prefix of a few pages does not start sixteen listers to find them empty.

Correctness does not rest on estimates: a steal lowers the victim's end in the
same step (nothing else runs between two awaits of one loop) and the thief's
range starts exactly there, so the ranges always partition the key space. A
victim whose page in flight returns names at or past its new end drops them and
stops; they belong to the thief.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from torchbucket._keyspace import Columns, KeyScale
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["ListingStats", "list_parallel"]

logger = logging.getLogger(__name__)

# A range is aimed at this fraction of a whole number of pages, so that its
# last page is seldom a short one holding a handful of names.
_PAGE_AIM = 0.9
# Whole pages a lister keeps when its top range is cut (more as the listing
# grows): fewer make more ranges, each with its own short last page.
_MIN_KEEP = 3.0
# Slow start: listers let in per well-filled page (2 triples them per round).
_GROWTH = 2
# A top range is cut at most this many pages (times the pages listed so far)
# past the last name seen: past the end of the prefix a guess is an empty
# request. Measured on the emulator: 1.5 lists slower, 3 wastes more requests.
_SPECULATION = 2.0
# Ranges not yet answered (guesses), at most this many per page listed so far.
_GUESSES = 2.0


@dataclass
class ListingStats:
    """What one listing cost.

    Attributes:
        requests: Page requests made.
        ranges: Key ranges listed (1 when the listing was not split).
        steals: Ranges cut off another range.
    """

    requests: int = 0
    ranges: int = 0
    steals: int = 0


@dataclass(eq=False)
class _Range:
    """A key range ``[start, end)`` (``start`` exclusive once ``cursor`` is set)."""

    start: str | None
    end: str | None
    cursor: str | None = None
    objects: list[ObjectInfo] = field(default_factory=list)
    # Density sample: first and last name seen and how many names in between,
    # this range's own once it has seen two names, else its parent's.
    first: str | None = None
    sample: tuple[str, str, int] | None = None
    in_flight: bool = False
    done: bool = False
    memo: tuple[object, tuple[float, str] | None] | None = None


class _Job:
    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        parallelism: int,
        page_size: int,
        on_page: Callable[[int], None] | None,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.parallelism = parallelism
        self.page_size = page_size
        self.on_page = on_page
        self.ranges: list[_Range] = []
        self.columns = Columns()
        self.limit = 1
        self.active = 0
        self.listed = 0
        self.frontier = ""  # the greatest name seen so far
        self.void = False  # a guess past the frontier found nothing
        self.idle: list[asyncio.Future[_Range | None]] = []
        self.stats = ListingStats()

    # -- requests -------------------------------------------------------------

    async def _drain(self, r: _Range, token: str | None = None) -> None:
        query_end: str | None = r.end
        start: str | None = r.cursor if r.cursor is not None else r.start
        while True:
            if token is None:
                query_end = r.end
                start = r.cursor if r.cursor is not None else r.start
            r.in_flight = True
            try:
                self.stats.requests += 1
                page = await self.store.list_page(
                    self.prefix,
                    start_offset=start,
                    end_offset=query_end,
                    page_token=token,
                    page_size=self.page_size,
                )
            finally:
                r.in_flight = False
            past_end = self._take(r, page.objects)
            self._grow(len(page.objects))
            if past_end or page.next_page_token is None:
                if r.cursor is None and r.start is not None and r.start > self.frontier:
                    # A guess past every name seen found nothing: the names
                    # probably end before it. Guess no further (ranges that have
                    # listed something can still be cut).
                    self.void = True
                r.done = True
                self.active -= 1
                self._dispatch()
                return
            token = page.next_page_token if query_end == r.end else None
            self._dispatch()

    def _grow(self, count: int) -> None:
        self.listed += count
        if 2 * count >= self.page_size:
            # Slow start: each well-filled page lets one more lister in.
            self.limit = min(self.parallelism, self.limit + _GROWTH)

    def _take(self, r: _Range, objects: list[ObjectInfo]) -> bool:
        """Keep the page's names that belong to ``r``; whether it ran past its end."""
        if not objects:
            return False
        end, cursor = r.end, r.cursor
        past_end = False
        if (cursor is None or objects[0].name > cursor) and (end is None or objects[-1].name < end):
            kept = objects
        else:
            kept = []
            for obj in objects:
                if cursor is not None and obj.name <= cursor:
                    continue
                if end is not None and obj.name >= end:
                    past_end = True
                    break
                kept.append(obj)
        if kept:
            r.objects.extend(kept)
            if r.first is None:
                r.first = kept[0].name
            r.cursor = kept[-1].name
            if self.frontier < r.cursor:
                self.frontier = r.cursor
            if r.first != r.cursor:
                r.sample = (r.first, r.cursor, len(r.objects))
            # A sample is enough to learn which characters each position holds.
            cut, step = len(self.prefix), max(1, len(kept) // 64)
            self.columns.update([o.name[cut:] for o in kept[::step]] + [kept[-1].name[cut:]])
            if self.on_page is not None:
                self.on_page(len(kept))
        return past_end

    # -- stealing ---------------------------------------------------------------

    def _top_pages(self) -> float:
        """Pages the lister of the top range keeps when a thief cuts it."""
        per_lister = self.listed / self.page_size / self.parallelism
        return max(_MIN_KEEP, float(int(per_lister))) - (1.0 - _PAGE_AIM)

    def _guesses_allowed(self) -> tuple[bool, bool]:
        """Whether one more guess is affordable: (cutting the top, cutting a bounded range).

        A new range is a guess until its first page answers: it may lie past
        the last name (a top range cut ahead of its lister) or in a stretch
        the estimate got wrong. Guesses in flight are kept below a multiple of
        the pages listed so far (less one page for cutting bounded ranges, so
        that a prefix of two pages is not cut three ways), so a small prefix
        costs a request or two more than a sequential listing, not a lister's
        worth.
        """
        guesses = sum(1 for r in self.ranges if r.cursor is None and not r.done)
        pages = self.listed / self.page_size
        return (
            guesses < max(1.0, _GUESSES * pages),
            guesses < _GUESSES * (pages - 1.0),
        )

    def _plan(self, r: _Range) -> tuple[float, str] | None:
        """How much work ``r`` has left (in pages) and where to cut it, if it can be."""
        if r.done or r.sample is None:
            return None
        if r.cursor is None and (r.end is not None or self.void):
            # Nothing listed here yet. A top range that has not answered yet may
            # still be cut (the listers need not wait a round trip for it),
            # unless a guess past every name seen has come back empty: past the
            # last name every cut is an empty request.
            return None
        # Estimates are worked out again only when something they rest on moved.
        memo_key = (
            r.cursor,
            r.end,
            r.in_flight,
            r.sample,
            self.columns.version,
            # A top range's cut also rests on how much was listed, and where.
            (self.listed, self.frontier) if r.end is None else None,
        )
        if r.memo is not None and r.memo[0] == memo_key:
            return r.memo[1]
        plan = self._estimate(r)
        r.memo = (memo_key, plan)
        return plan

    def _estimate(self, r: _Range) -> tuple[float, str] | None:
        assert r.sample is not None
        a, b, seen = r.sample
        low = r.cursor if r.cursor is not None else r.start
        keys = [a, b] + [k for k in (low, r.end) if k is not None]
        if r.end is None and self.frontier:
            keys.append(self.frontier)
        scale = KeyScale(
            keys, prefix=self.prefix, columns=self.columns, strip_common=r.end is not None
        )
        per_name = scale.value(b) - scale.value(a)
        if per_name <= 0:
            return None
        # Key-space width of one page, as a fraction over the names counted.
        page_num, page_den = per_name * self.page_size, seen - 1
        pos = scale.value(low) if low is not None else 0
        if r.in_flight:
            pos += page_num // page_den
        end = scale.value(r.end)
        if r.end is None:
            # Guess no further past the last name seen than pages have been
            # listed so far (doubling, as in an exponential search).
            keep = self._top_pages()
            target = pos + round(keep * 1000) * page_num // (page_den * 1000)
            seen_to = scale.value(self.frontier) if self.frontier else 0
            ahead = (target - seen_to) * page_den / page_num
            if ahead > max(keep + 1.0, _SPECULATION * self.listed / self.page_size):
                return None
            if target < end:
                cut = scale.key_between(target, low, None)
                return None if cut is None else (2 * keep, cut)
            if r.cursor is None:
                return None
            # Past the characters seen so far: treat the rest of the known key
            # space as the range and halve it, as for a bounded one.
        left = end - pos
        pages_left = left * page_den / page_num if left > 0 else 0.0
        if pages_left < 2:
            return None
        cut = scale.key_between(pos + left // 2, low, r.end)
        return None if cut is None else (pages_left, cut)

    def _steal(self) -> _Range | None:
        top_ok, bounded_ok = self._guesses_allowed()
        best: tuple[float, str, _Range] | None = None
        for r in self.ranges:
            if not (top_ok if r.end is None else bounded_ok):
                continue
            plan = self._plan(r)
            if plan is not None and (best is None or plan[0] > best[0]):
                best = (plan[0], plan[1], r)
        if best is None:
            return None
        _, cut, victim = best
        thief = _Range(start=cut, end=victim.end, sample=victim.sample)
        victim.end = cut
        self.ranges.append(thief)
        self.stats.steals += 1
        logger.debug("listing %s: range cut at %r", self.prefix, cut)
        return thief

    def _dispatch(self) -> None:
        """Hand new ranges to idle listers, or release them when all is listed."""
        if all(r.done for r in self.ranges):
            while self.idle:
                self.idle.pop().set_result(None)
            return
        while self.idle and self.active < self.limit:
            thief = self._steal()
            if thief is None:
                return
            self.active += 1
            self.idle.pop().set_result(thief)

    async def _lister(self, first: _Range | None) -> None:
        r = first
        while True:
            if r is None:
                waiter: asyncio.Future[_Range | None] = asyncio.get_running_loop().create_future()
                self.idle.append(waiter)
                self._dispatch()
                r = await waiter
                if r is None:
                    return
            await self._drain(r)
            r = None

    async def run(self) -> list[ObjectInfo]:
        root = _Range(start=None, end=None)
        self.ranges.append(root)
        self.active = 1
        self.stats.requests += 1
        page = await self.store.list_page(self.prefix, page_size=self.page_size)
        self._take(root, page.objects)
        if page.next_page_token is None or root.cursor is None:
            if page.next_page_token is not None:
                # An empty first page that still has more: list on, one lister.
                await self._drain(root, page.next_page_token)
            root.done = True
            return self._collect()
        self._grow(len(page.objects))
        tasks = [asyncio.ensure_future(self._lister(root))]
        tasks += [asyncio.ensure_future(self._lister(None)) for _ in range(self.parallelism - 1)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self._collect()

    def _collect(self) -> list[ObjectInfo]:
        self.stats.ranges = len(self.ranges)
        chunks = sorted(self.ranges, key=lambda r: r.start or "")
        out = [obj for r in chunks for obj in r.objects]
        names = [o.name for o in out]
        # The ranges partition the key space and each holds increasing names,
        # so this is sorted and unique unless a store broke the page contract.
        if all(a < b for a, b in itertools.pairwise(names)):
            return out
        logger.warning("listing %s: the store returned names out of order; sorting", self.prefix)
        out.sort(key=lambda o: o.name)
        return [o for i, o in enumerate(out) if i == 0 or o.name != out[i - 1].name]


async def list_parallel(
    store: ObjectStore,
    prefix: str,
    *,
    parallelism: int,
    page_size: int,
    on_page: Callable[[int], None] | None = None,
    stats: ListingStats | None = None,
) -> list[ObjectInfo]:
    """Every object under ``prefix``, sorted by name, unfiltered.

    Args:
        store: Where to list.
        prefix: Names that start with this.
        parallelism: Most page requests in flight at once.
        page_size: Objects asked for per page.
        on_page: Called with the number of new objects after each page.
        stats: Filled with what the listing cost.

    Raises:
        StorageError: A page request failed (after the store's own retries);
            the other listers are cancelled first.
    """
    job = _Job(store, prefix, parallelism=parallelism, page_size=page_size, on_page=on_page)
    try:
        return await job.run()
    finally:
        if stats is not None:
            stats.requests, stats.ranges, stats.steals = (
                job.stats.requests,
                len(job.ranges),
                job.stats.steals,
            )
