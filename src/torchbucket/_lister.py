"""The parallel lister: key ranges of one prefix, cut where the names are.

One listing job, on one event loop. The first page is fetched plainly; when it
says there is no more, the listing cost one request. Otherwise the rest of the
prefix's key space, ``(last name of page 1, end of prefix)``, is one range,
and ranges are cut in two ways, both from densities (names per unit of key
space, see :mod:`torchbucket._keyspace`) measured on pages already listed:

A range that has listed a page of its own is cut once the range past its end
has answered (the top range, which runs to the end of the prefix, at once):

- *Fills*: when names go on right past its end, the range is cut at once into
  pieces of nine tenths of a page each, listed one request each, as many at a
  time as ``parallelism`` allows.
- *Probes*: when nobody knows whether its names go on, it keeps a stretch and
  hands out ranges at geometrically growing distances. The top range probes
  near where the names would end if the density held to the end of the
  prefix's key space (a page and a half short of it), with one probe after
  the first page (a prefix of two pages costs three requests) and a couple
  more per page listed. A range whose neighbour came back empty, or starts
  with names far past it, runs an exponential search instead: a probe per
  doubling of the distance, in one round (at least four, else two per page
  listed), so past the end of the names only a few come back empty.

Names in folders (``train/<class>/<n>.png``) are clusters, whose ends no
density measured in one folder predicts. Where the store lists one level of
the tree in a request (GCS's ``delimiter=/``) and the first page's folders
hold half a page or more each, the folders are named in one request and each
is listed as a prefix of its own, cut into ranges like any prefix (with no
probe before its second page: most folders end within two). With a 60 ms
page model, ImageNet's layout (77 folders of 1,300) takes 154 requests for
101 pages in 0.36 s, where key ranges alone drew 2,300 requests and 2.5 s.
Without folder listings the lister still counts its empty probes: the top
range sends at most one probe more than twice those of its probes that found
names, and while most searches come back empty a range waits for its page in
flight before searching past it (the page often ends the cluster). A range
whose neighbour above came back empty is searched, never halved by an idle
lister. The demo's layout (6 folders, 17 pages): 23 requests in 0.26 s with
folders, 33 in 0.5 s without, against 82 in 0.5 s before either.

Names spread evenly (hashes) are thus listed in about four round trips, since
the first probe finds names at the far end; names packed at one end
(counters) take a few rounds of probes more. Measured on the emulator
(same-region latency, 100k objects, fresh process): 0.45-0.5 s hashed,
0.55-0.7 s sequential, 117-121 requests for 100 pages.

A piece whose estimate was wrong comes back with a page token: it has its own
density by then and is cut again the same way; a lister with nothing to do
halves the range below the greatest name seen with the most work left. A wrong estimate
costs time or a request, never a name.

Correctness does not rest on estimates: a cut lowers the range's end in the
same step (nothing else runs between two awaits of one loop) and the new
range starts exactly there, so the ranges always partition the key space. A
range whose page in flight returns names at or past its new end drops them
and stops; they belong to the range cut off it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from torchbucket._keyspace import Columns, KeyScale
from torchbucket.storage.base import ObjectInfo, ObjectStore, SupportsFolders

__all__ = ["ListingStats", "list_parallel"]

logger = logging.getLogger(__name__)

# A fill piece is aimed at this fraction of a page, so that the spread of the
# names around the estimate seldom pushes it onto a second page.
_PAGE_AIM = 0.9
# The last probe starts this many pages short of where the names would end if
# the density measured held to the end of the key space.
_TAIL_PAGES = 1.5
# Probes in flight at once: at most this many per page listed past the first,
# and at most _MAX_PROBES.
_PROBES_PER_PAGE = 2.0
_MAX_PROBES = 8
# Probes of an exponential search past the end of the names: at least this
# many, else as many per page listed as above, up to one per doubling.
_MIN_SEARCH = 4
# While fewer than this fraction of search probes find names (Laplace
# estimate), a range waits for its page in flight before searching past it.
_SEARCH_HIT_RATE = 0.5
# A cut makes at most this many pieces per lister (a range of more pages than
# that is cut into pieces of several pages each, listed with page tokens).
_PIECES_PER_LISTER = 4
# A prefix whose folders on the first page hold fewer names than this many
# pages each on average is listed as one key space, not folder by folder.
_MIN_FOLDER = 0.5


def _geometric(first: float, last: float, count: int) -> list[float]:
    """``count`` offsets from ``first`` to ``last`` (one: ``last``), each a constant factor apart."""
    if count <= 1:
        return [last]
    ratio = (last / first) ** (1 / (count - 1))
    return [first * ratio**i for i in range(count - 1)] + [last]


_paused_by_listings = 0


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a listing builds its objects.

    A listing of 100k objects creates 100k ``ObjectInfo`` (GC-tracked) in half a
    second; the collector's full passes over a heap growing by that much cost
    0.05 s of the loop's time, and the loop's CPU sets the pace of a big listing
    (emulator, same-region latency, fresh process: 100k hashed names 0.46 s with
    the collector, 0.41 s without). Nothing a listing allocates forms cycles.
    Only the listings that turned it off turn it back on, when the last of them
    ends (a collector that was off stays off).
    """
    global _paused_by_listings
    if _paused_by_listings == 0 and not gc.isenabled():
        yield
        return
    _paused_by_listings += 1
    gc.disable()
    try:
        yield
    finally:
        _paused_by_listings -= 1
        if _paused_by_listings == 0:
            gc.enable()


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
    prefix: str
    cursor: str | None = None
    objects: list[ObjectInfo] = field(default_factory=list)
    # Density sample: first and last name seen and how many names in between,
    # this range's own once it has seen two names, else its parent's.
    first: str | None = None
    sample: tuple[str, str, int] | None = None
    in_flight: bool = False
    done: bool = False
    filled: bool = False  # cut into fill pieces already (or nothing to cut)
    # Cut off as a probe and not yet answered: past the top range (no end), or
    # a search past a range's names.
    probe: Literal["top", "search"] | None = None
    memo: tuple[str | None, str | None] | None = None  # what the last cut rested on


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
        self.probes: collections.deque[_Range] = collections.deque()
        self.fills: collections.deque[_Range] = collections.deque()
        self.starts: dict[str, _Range] = {}  # ranges by start
        # Per listing prefix (the job's, or one of its folders).
        self.columns: collections.defaultdict[str, Columns] = collections.defaultdict(Columns)
        self.frontiers: collections.defaultdict[str, str] = collections.defaultdict(str)
        self.active = 0
        self.listed = 0
        # Probes of the top range that found names; searches answered, and found names.
        self.top_hits = 0
        self.searches = 0
        self.search_hits = 0
        self.idle: list[asyncio.Future[_Range | None]] = []
        self.stats = ListingStats()

    # -- requests -------------------------------------------------------------

    async def _drain(self, r: _Range, token: str | None = None) -> None:
        query_end: str | None = r.end
        while True:
            if token is None:
                query_end = r.end
            start = r.cursor if r.cursor is not None else r.start
            r.in_flight = True
            try:
                self.stats.requests += 1
                page = await self.store.list_page(
                    r.prefix,
                    start_offset=start,
                    end_offset=query_end,
                    page_token=token,
                    page_size=self.page_size,
                )
            finally:
                r.in_flight = False
            if r.probe is not None:
                found = bool(page.objects)
                if r.probe == "top":
                    self.top_hits += found
                else:
                    self.searches += 1
                    self.search_hits += found
                r.probe = None
            past_end = self._take(r, page.objects)
            self.listed += len(page.objects)
            finished = past_end or page.next_page_token is None
            r.done = finished
            self._plan()
            if finished:
                self.active -= 1
                self._dispatch()
                return
            token = page.next_page_token if query_end == r.end else None
            self._dispatch()

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
            if self.frontiers[r.prefix] < r.cursor:
                self.frontiers[r.prefix] = r.cursor
            if r.first != r.cursor:
                r.sample = (r.first, r.cursor, len(r.objects))
            # A sample is enough to learn which characters each position holds.
            cut, step = len(r.prefix), max(1, len(kept) // 64)
            self.columns[r.prefix].update(
                [o.name[cut:] for o in kept[::step]] + [kept[-1].name[cut:]]
            )
            if self.on_page is not None:
                self.on_page(len(kept))
        return past_end

    # -- cutting ----------------------------------------------------------------

    def _measure(
        self, r: _Range, extra: str | None = None
    ) -> tuple[KeyScale, int, int, int] | None:
        """``(scale, position, page numerator, page denominator)`` of ``r``.

        The position is where ``r``'s lister will be once its request in
        flight returns; one page is ``numerator / denominator`` units of the
        scale. ``None`` when ``r`` has no density to go by.
        """
        if r.sample is None:
            return None
        a, b, seen = r.sample
        low = r.cursor if r.cursor is not None else r.start
        keys = [a, b] + [k for k in (low, r.end) if k is not None]
        frontier = self.frontiers[r.prefix]
        if r.end is None and frontier:
            keys.append(frontier)
        if extra is not None:
            keys.append(extra)
        scale = KeyScale(
            keys, prefix=r.prefix, columns=self.columns[r.prefix], strip_common=r.end is not None
        )
        per_name = scale.value(b) - scale.value(a)
        if per_name <= 0:
            return None
        page_num, page_den = per_name * self.page_size, seen - 1
        pos = scale.value(low) if low is not None else 0
        if r.in_flight:
            pos += page_num // page_den
        return scale, pos, page_num, page_den

    def _cut(self, r: _Range, scale: KeyScale, targets: list[int], *, probe: bool) -> list[_Range]:
        """Cut ``r`` at the keys nearest ``targets`` (increasing); the new ranges."""
        low = r.cursor if r.cursor is not None else r.start
        keys: list[str] = []
        for target in targets:
            key = scale.key_between(target, keys[-1] if keys else low, r.end)
            if key is not None and (not keys or key > keys[-1]):
                keys.append(key)
        if not keys:
            return []
        pieces = [
            _Range(start=key, end=nxt, prefix=r.prefix, sample=r.sample)
            for key, nxt in zip(keys, [*keys[1:], r.end])
        ]
        r.end = keys[0]
        self.ranges.extend(pieces)
        self.starts.update((p.start, p) for p in pieces if p.start is not None)
        self.stats.steals += len(pieces)
        logger.debug("listing %s: %s cut at %r", self.prefix, "probes" if probe else "fill", keys)
        return pieces

    def _fill(self, r: _Range) -> None:
        """Cut ``r`` (names are known past its end) into pieces of about a page."""
        r.filled = True
        measured = self._measure(r)
        if measured is None:
            return
        scale, pos, page_num, page_den = measured
        left = scale.value(r.end) - pos
        pages = left * page_den / page_num
        count = min(int(pages / _PAGE_AIM) + 1, _PIECES_PER_LISTER * self.parallelism)
        if count < 2 or pages < 1.2:
            return
        if r.in_flight:
            # The page in flight is about to end near ``pos``: cut a little
            # short of it, so that it runs past the end instead of leaving a
            # sliver that would cost its own request.
            pos -= page_num // (page_den * 20)
            left = scale.value(r.end) - pos
            targets = [pos + left * i // count for i in range(count)]
        else:
            targets = [pos + left * i // count for i in range(1, count)]
        self.fills.extend(self._cut(r, scale, targets, probe=False))

    def _probe(self, r: _Range) -> None:
        """Hand out ranges past ``r``'s names, where nobody knows whether names go on."""
        measured = self._measure(r)
        if measured is None:
            return
        scale, pos, page_num, page_den = measured
        pages = (scale.value(r.end) - pos) * page_den / page_num
        if pages < 2 * _PAGE_AIM:
            return
        offsets: list[float]
        if r.end is None:
            # Nothing says where the names end: probe near where they would
            # end if the density held (spread names end there), and on the
            # way there as far as the budget goes.
            tail = pages - _TAIL_PAGES
            if tail < 2 * _PAGE_AIM:
                return
            pages_listed = self.listed / self.page_size - 1.0
            # No more than one probe more than twice those of the top range
            # that found names: names in clusters (folders) leave most
            # probes between them empty.
            budget = max(1.0, _PROBES_PER_PAGE * pages_listed)
            count = int(min(_MAX_PROBES, budget, 1 + 2 * self.top_hits))
            offsets = _geometric(_PAGE_AIM, tail, count)
        elif pages <= _PAGE_AIM * (_MAX_PROBES + 1):
            # The names end within a few pages: pieces of a page each.
            count = int(pages / _PAGE_AIM) + 1
            offsets = [pages * i / count for i in range(1, count)]
        else:
            # The names end before r's end (the range past it came back empty,
            # or its names start far from it): double the distance with each
            # probe, an exponential search in one round. Past the end of the
            # names only a few come back empty, whichever the end.
            # As many probes as doublings, fewer while few pages are listed:
            # a prefix of a few pages costs a few empty requests, not ten.
            pages_listed = self.listed / self.page_size - 1.0
            count = min(
                math.ceil(math.log2(pages / _PAGE_AIM)),
                int(max(_MIN_SEARCH, _PROBES_PER_PAGE * pages_listed) * self._search_hit_rate()),
            )
            count = max(count, 1)
            offsets = _geometric(_PAGE_AIM, pages, count + 1)[:-1]
        targets = [pos + round(g * 1000) * page_num // (page_den * 1000) for g in offsets]
        pieces = self._cut(r, scale, targets, probe=True)
        for p in pieces:
            p.probe = "top" if r.end is None else "search"
        self.probes.extend(pieces)

    def _search_hit_rate(self) -> float:
        """The fraction of answered searches that found names, one hit assumed."""
        return (self.search_hits + 1) / (self.searches + 1)

    def _far(self, r: _Range, key: str) -> bool:
        """Whether ``key`` (past ``r``'s end) lies more than a page of ``r``'s names past it."""
        measured = self._measure(r, key)
        if measured is None:
            return True
        scale, _, page_num, page_den = measured
        return (scale.value(key) - scale.value(r.end)) * page_den > page_num

    def _plan(self) -> None:
        """Cut what the names seen so far say can be cut.

        A range with a page of its own is cut once the range past its end has
        answered: into fill pieces when names go on right past its end, into
        probes when they do not (it came back empty, or its names start far
        on). The top range (no end) is probed at once.
        """
        for r in self.ranges:  # pieces cut here join the loop, and are skipped
            if r.done or r.filled or r.first is None or r.first == r.cursor:
                continue
            if r.end is None:
                if r.prefix != self.prefix and len(r.objects) < 2 * self.page_size:
                    continue  # most folders end within two pages: no probe yet
                if r.memo != (None, r.cursor):
                    r.memo = (None, r.cursor)
                    self._probe(r)
                continue
            above = self.starts[r.end]
            if above.first is None and not above.done:
                continue  # not answered yet
            memo = (r.end, above.first)
            if r.memo == memo:
                continue
            near = above.first is not None and not self._far(r, above.first)
            if not near and r.in_flight and self._search_hit_rate() < _SEARCH_HIT_RATE:
                continue
            r.memo = memo
            if near:
                self._fill(r)
            else:
                self._probe(r)

    def _steal(self) -> _Range | None:
        """Half of the range below the frontier with the most pages left, if any."""
        best: tuple[float, str, _Range] | None = None
        for r in self.ranges:
            if r.done or r.cursor is None or r.end is None or r.end > self.frontiers[r.prefix]:
                continue
            if self.starts[r.end].first is None:
                continue  # its names may end anywhere: searched, not halved
            measured = self._measure(r)
            if measured is None:
                continue
            scale, pos, page_num, page_den = measured
            left = scale.value(r.end) - pos
            pages = left * page_den / page_num
            if pages < 2 or (best is not None and pages <= best[0]):
                continue
            cut = scale.key_between(pos + left // 2, r.cursor, r.end)
            if cut is not None:
                best = (pages, cut, r)
        if best is None:
            return None
        _, cut, victim = best
        thief = _Range(start=cut, end=victim.end, prefix=victim.prefix, sample=victim.sample)
        victim.end = cut
        self.ranges.append(thief)
        self.starts[cut] = thief
        self.stats.steals += 1
        logger.debug("listing %s: range cut at %r", self.prefix, cut)
        return thief

    def _next(self) -> _Range | None:
        if self.probes:
            return self.probes.popleft()
        if self.fills:
            return self.fills.popleft()
        return self._steal()

    def _dispatch(self) -> None:
        """Hand new ranges to idle listers, or release them when all is listed."""
        if not self.probes and not self.fills and all(r.done for r in self.ranges):
            while self.idle:
                self.idle.pop().set_result(None)
            return
        while self.idle and self.active < self.parallelism:
            r = self._next()
            if r is None:
                return
            self.active += 1
            self.idle.pop().set_result(r)

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
        root = _Range(start=None, end=None, prefix=self.prefix)
        self.ranges.append(root)
        self.active = 1
        self.stats.requests += 1
        page = await self.store.list_page(self.prefix, page_size=self.page_size)
        self._take(root, page.objects)
        self.listed += len(page.objects)
        if page.next_page_token is None or root.cursor is None:
            if page.next_page_token is not None:
                # An empty first page that still has more: list on, one lister.
                await self._drain(root, page.next_page_token)
            root.done = True
            return self._collect()
        if await self._split_into_folders(root, page.objects):
            self.active = 0
            first = None
        else:
            first = root
        self._plan()
        tasks = [asyncio.ensure_future(self._lister(first))]
        tasks += [asyncio.ensure_future(self._lister(None)) for _ in range(self.parallelism - 1)]
        with _collector_paused():
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return self._collect()

    async def _split_into_folders(self, root: _Range, first_page: list[ObjectInfo]) -> bool:
        """List the rest of the prefix folder by folder, where it is in folders.

        Names in folders (``train/<class>/<n>.png``) are clusters in the key
        space, whose ends no density measured in one folder predicts: probes
        between folders come back empty. A store that lists one level of the
        tree (GCS's ``delimiter=/``) names the folders in one request, when
        they fit on a page; each is then listed as a prefix of its own (cut
        into ranges as any prefix), and the names directly under the prefix
        come with the folders. Folders smaller than half a page on the first
        page, or more than a page of them: listed as one key space, as before.

        Returns:
            Whether it split: ``root`` is then done.
        """
        if not isinstance(self.store, SupportsFolders) or root.cursor is None:
            return False
        cut, cursor = len(self.prefix), root.cursor
        sizes: collections.Counter[str] = collections.Counter()
        for obj in first_page:
            slash = obj.name.find("/", cut)
            if slash >= 0:
                sizes[obj.name[: slash + 1]] += 1
        # The first page's last folder may go on past it; the others are whole.
        whole = [n for folder, n in sizes.items() if not cursor.startswith(folder)]
        if not sizes or (whole and sum(whole) < _MIN_FOLDER * self.page_size * len(whole)):
            return False
        self.stats.requests += 1
        level = await self.store.list_folder(self.prefix, page_size=self.page_size)
        if level.next_page_token is not None or len(level.objects) + len(level.prefixes) > (
            self.page_size
        ):
            return False  # more than a page (fake-gcs-server counts objects only)
        folders = [
            _Range(start=f, end=None, prefix=f, cursor=cursor if cursor.startswith(f) else None)
            for f in level.prefixes
            if f > cursor or cursor.startswith(f)
        ]
        if not folders:
            return False
        # Names directly under the prefix came whole with the folders.
        rest = [
            _Range(start=o.name, end=None, prefix=self.prefix, objects=[o], done=True)
            for o in level.objects
            if o.name > cursor
        ]
        root.done = True
        self.ranges += folders + rest
        self.fills.extend(folders)
        logger.debug("listing %s: split into %d folders", self.prefix, len(folders))
        return True

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
