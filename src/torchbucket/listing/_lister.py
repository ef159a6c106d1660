"""The parallel lister: key ranges of one prefix, cut where the names are.

One listing job, on one event loop. The first page is fetched plainly; when it
says there is no more, the listing cost one request. Otherwise the rest of the
prefix's key space, ``(last name of page 1, end of prefix)``, is one range,
and ranges are cut in two ways, both from densities (names per unit of key
space, see :mod:`._keyspace`) measured on pages already listed:

A range that has listed a page of its own is cut once the range past its end
has answered (the top range, which runs to the end of the prefix, at once):

- *Fills*: when names go on right past its end, the range is cut at once into
  pieces of nine tenths of a page each, listed one request each, as many at a
  time as ``parallelism`` allows.
- *Probes*: when nobody knows whether its names go on, it keeps a stretch and
  hands out ranges at geometrically growing distances. The top range probes
  near where the names would end if the density held to the end of the
  prefix's key space (a page and a half short of it), and on the way there.
  After the first page that is, for names counted up (``img/000000.jpg``...),
  one probe midway (geometrically) between it and the far one (a prefix of
  two pages costs four requests) and, for names spread thinly over the key
  space (hashes), up to 32 pieces of a page each right past the first page
  (none where the names are packed under a stem: their density would make
  more than a billion objects);
  then a couple more per page listed. A range whose neighbour came back empty, or starts
  with names far past it, runs an exponential search instead: a probe per
  doubling of the distance, in one round (at least four, else two per page
  listed), so past the end of the names only a few come back empty. Past
  counted names the doubling is of the position from the key space's start,
  where they began, not of the distance from the last name seen, and a range
  they end within 16 pages of is cut into pieces of a page, not searched.

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

Names spread evenly (hashes) are thus listed in about three round trips: the
pieces past the first page are listed while the far probe finds names, and
the fan-out follows (at 0.07 s, not 0.15 s with the far probe alone). Names
packed at the start of their key space (counters) take one more, the midway
probe's (without it the far probe came back empty and a search took a round
more: fanned out at 0.23 s, not 0.15 s); their end is searched for while the
pages before it are listed. Names spread thinly at first and packed further
on (hashes under one date) may leave the guessed pieces empty: at most 16
requests. Measured on the emulator (same-region latency, 100k objects, fresh
process): about 0.5 s hashed, 0.6-0.65 s sequential, 115-122 requests for
100 pages.

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
import operator
from collections.abc import Callable, Iterator

from torchbucket.listing._ranges import ListingStats, Planner, Range
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.capabilities import SupportsFolders

__all__ = ["ListingStats", "list_parallel"]

logger = logging.getLogger(__name__)

_name = operator.attrgetter("name")

# A prefix whose folders on the first page hold fewer names than this many
# pages each on average is listed as one key space, not folder by folder.
_MIN_FOLDER = 0.5


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


class _Job:
    """One listing: its listers, the requests they send, and when they stop.

    Which ranges there are and where they are cut is the planner's
    (:class:`._ranges.Planner`); the job sends each range's pages, feeds them
    to the planner, and hands what it cuts to idle listers.
    """

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
        self.stats = ListingStats()
        self.plan = Planner(
            prefix, parallelism=parallelism, page_size=page_size, stats=self.stats, on_page=on_page
        )
        self.active = 0
        self.idle: list[asyncio.Future[Range | None]] = []

    # -- requests -------------------------------------------------------------

    async def _drain(self, r: Range, token: str | None = None) -> None:
        plan = self.plan
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
                plan.answered(r, bool(page.objects))
            past_end = plan.take(r, page.objects)
            finished = past_end or page.next_page_token is None
            r.done = finished
            plan.plan()
            if finished:
                self.active -= 1
                self._dispatch()
                return
            token = page.next_page_token if query_end == r.end else None
            self._dispatch()

    def _dispatch(self) -> None:
        """Hand new ranges to idle listers, or release them when all is listed."""
        if not self.plan.pending():
            while self.idle:
                self.idle.pop().set_result(None)
            return
        while self.idle and self.active < self.parallelism:
            r = self.plan.next_range()
            if r is None:
                return
            self.active += 1
            self.idle.pop().set_result(r)

    async def _lister(self, first: Range | None) -> None:
        r = first
        while True:
            if r is None:
                waiter: asyncio.Future[Range | None] = asyncio.get_running_loop().create_future()
                self.idle.append(waiter)
                self._dispatch()
                r = await waiter
                if r is None:
                    return
            await self._drain(r)
            r = None

    async def run(self) -> list[ObjectInfo]:
        root = Range(start=None, end=None, prefix=self.prefix)
        self.plan.ranges.append(root)
        self.active = 1
        self.stats.requests += 1
        page = await self.store.list_page(self.prefix, page_size=self.page_size)
        self.plan.take(root, page.objects)
        if page.next_page_token is None or root.cursor is None:
            if page.next_page_token is not None:
                # An empty first page that still has more: list on, one lister.
                await self._drain(root, page.next_page_token)
            root.done = True
            return self._collect()
        split, lead = await self._split_into_folders(root, page.objects)
        # The range the first page ends in goes on at once, before the probes
        # planned past it: the root, or the folder the page ends in.
        first = lead if split else root
        self.active = 0 if first is None else 1
        self.plan.plan()
        listers = [self._lister(first)]
        listers += [self._lister(None) for _ in range(self.parallelism - 1)]
        with _collector_paused():
            await gather_or_cancel(listers)
            return self._collect()

    async def _split_into_folders(
        self, root: Range, first_page: list[ObjectInfo]
    ) -> tuple[bool, Range | None]:
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
            Whether it split (``root`` is then done), and the folder the first
            page ends in (listed on first), if any.
        """
        if not isinstance(self.store, SupportsFolders) or root.cursor is None:
            return False, None
        cut, cursor = len(self.prefix), root.cursor
        sizes: collections.Counter[str] = collections.Counter()
        for obj in first_page:
            slash = obj.name.find("/", cut)
            if slash >= 0:
                sizes[obj.name[: slash + 1]] += 1
        # The first page's last folder may go on past it; the others are whole.
        whole = [n for folder, n in sizes.items() if not cursor.startswith(folder)]
        if not sizes or (whole and sum(whole) < _MIN_FOLDER * self.page_size * len(whole)):
            return False, None
        self.stats.requests += 1
        level = await self.store.list_folder(self.prefix, page_size=self.page_size)
        if level.next_page_token is not None or len(level.objects) + len(level.prefixes) > (
            self.page_size
        ):
            return False, None  # more than a page (fake-gcs-server counts objects only)
        folders = [
            Range(start=f, end=None, prefix=f)
            for f in level.prefixes
            if f > cursor or cursor.startswith(f)
        ]
        if not folders:
            return False, None
        lead: Range | None = None
        if cursor.startswith(folders[0].start or ""):
            # The first page's last folder goes on past it: its names on that
            # page are its first, it goes on at once (before the probes past
            # it), and where it is the only folder left and filled the page
            # (a date under its prefix) it is planned as its prefix would be
            # after its first page: probed at once, not after two more pages
            # of its own as folders are. 100k names under one date list as
            # under the date itself, plus the folder request: hashed in 4
            # rounds, not 7; counted in 6, not 11.
            lead, stem = folders[0], folders[0].start or ""
            own = [o for o in first_page if o.name.startswith(stem)]
            root.objects = [o for o in root.objects if not o.name.startswith(stem)]
            self.plan.take(lead, own, taken_before=True)
            lead.leads = len(folders) == 1 and len(own) >= self.page_size
        # Names directly under the prefix came whole with the folders.
        rest = [
            Range(start=o.name, end=None, prefix=self.prefix, objects=[o], done=True)
            for o in level.objects
            if o.name > cursor
        ]
        root.done = True
        self.plan.ranges += folders + rest
        self.plan.fills.extend(f for f in folders if f is not lead)
        logger.debug("listing %s: split into %d folders", self.prefix, len(folders))
        return True, lead

    def _collect(self) -> list[ObjectInfo]:
        ranges = self.plan.ranges
        self.stats.ranges = len(ranges)
        chunks = sorted(ranges, key=lambda r: r.start or "")
        out = list(itertools.chain.from_iterable(r.objects for r in chunks))
        names = list(map(_name, out))
        # The ranges partition the key space and each holds increasing names,
        # so this is sorted and unique unless a store broke the page contract.
        # (Compared in C: no Python frame per name.)
        if all(map(operator.lt, names, itertools.islice(names, 1, None))):
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
                len(job.plan.ranges),
                job.stats.steals,
            )
