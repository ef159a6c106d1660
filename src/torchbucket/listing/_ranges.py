"""The key ranges of one listing, and where to cut them.

The bookkeeping half of the parallel lister (:mod:`._lister` runs the
requests and says how the cuts are chosen): the ranges that partition the
prefix's key space, the names each has listed, the densities measured on them
(:mod:`._keyspace`), and the queues of probes and fill pieces cut from them.
Everything here is synchronous and runs between two awaits of the job's loop,
so a cut and the new range it makes happen in one step.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from torchbucket.listing._keyspace import Columns, KeyScale
from torchbucket.storage.base import ObjectInfo

__all__ = ["ListingStats", "Planner", "Range", "counted_up"]

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
# After a first page of names counted up (``img/000000.jpg``...), the top
# range also probes midway (geometrically) between the next page and the last
# probe when that spans more pages than this: 100k such names then fan out a
# round sooner (0.15 s, not 0.23 s, on the emulator's same-region latency) for
# one more request on a prefix of two pages (four, not three).
_MIDWAY_PAGES = 16.0
# After a first page of names spread thinly over their key space (hashes),
# the top range also hands out up to this many pieces of a page each right
# past the first page, listed while the far probe finds where the names end:
# 100k hashed names fanned out at 0.07 s, not 0.15 s, with 16; with 32 the
# client parses them until the fan-out's first answers come (interleaved:
# idle 0.142 s, not 0.190 s; wall 0.522 s, not 0.590 s; 64 gained nothing
# more). Names spread evenly have them all, and a prefix of a few pages is
# predicted as such (no pieces); names spread thinly at first and packed
# further on leave some empty.
_AHEAD_PIECES = 32
# ... unless the first page's density, held to the end of the key space,
# makes more pages than this (a billion objects): names packed under a stem
# the first page shares beyond the prefix (``d/20240101_<hash>``: 5.6e9
# pages) are not spread over the key space, and pieces past them would
# come back empty.
_SPREAD_PAGES = 1_000_000.0
# A page is counted up when at least this fraction of its neighbouring names
# (a sample of) first differ at the deepest place any of them do.
_COUNTED_UP = 0.5
_COUNT_PAIRS = 64
# Past names counted up, a range whose names end within this many pieces of a
# page (the range past it came back empty) is cut into such pieces, not
# searched: counted names are dense up to their end, so each piece short of it
# is a page, where the search's probes, several pages apart, each needed a
# second page a round later (100k counted names on the emulator: idle 0.21 s,
# not 0.25-0.27 s, for 125 requests, not 122; on the memory store's count of
# rounds 30k, 130k and 170k of them end a round sooner, for 0-5 more).
_COUNTED_PIECES = 16
# Probes of an exponential search past the end of the names: at least this
# many, else as many per page listed as above, up to one per doubling.
_MIN_SEARCH = 4
# While fewer than this fraction of search probes find names (Laplace
# estimate), a range waits for its page in flight before searching past it.
_SEARCH_HIT_RATE = 0.5
# A cut makes at most this many pieces per lister (a range of more pages than
# that is cut into pieces of several pages each, listed with page tokens).
_PIECES_PER_LISTER = 4


def counted_up(names: list[str]) -> bool:
    """Whether sorted ``names`` count up (``000998``, ``000999``, ``001000``...).

    Most neighbours of counted names first differ at their last digit, the
    deepest place at which any neighbours differ; neighbours among spread
    names (hashes) differ at places spread over a few characters, and few at
    the deepest. Counted names are packed at the start of the key space a
    density extrapolates over; spread names fill it.
    """
    if len(names) < 3:
        return False
    step = max(1, (len(names) - 1) // _COUNT_PAIRS)
    places = []
    for i in range(0, len(names) - 1, step):
        a, b = names[i], names[i + 1]
        n = min(len(a), len(b))
        place = next((j for j in range(n) if a[j] != b[j]), n)
        places.append(place)
    deepest = max(places)
    return places.count(deepest) >= _COUNTED_UP * len(places)


def _pieces(pos: int, end: int, page: int, count: int, in_flight: bool) -> list[int]:
    """Cuts of ``[pos, end)`` into ``count`` even pieces (``page``: one page's width).

    With the range's page in flight (about to end near ``pos``) the first cut
    lies a little short of ``pos``: the page runs past it rather than leaving
    a sliver that would cost its own request, or a round (the range listing
    it itself after that page).
    """
    if in_flight:
        pos -= page // 20
        return [pos + (end - pos) * i // count for i in range(count)]
    return [pos + (end - pos) * i // count for i in range(1, count)]


def _geometric(first: float, last: float, count: int) -> list[float]:
    """``count`` offsets from ``first`` to ``last`` (one: ``last``), each a constant factor apart."""
    if count <= 1:
        return [last]
    ratio = (last / first) ** (1 / (count - 1))
    return [first * ratio**i for i in range(count - 1)] + [last]


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
class Range:
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
    # The first name past its end that it was last checked against while its
    # first page was in flight (see Planner.plan).
    early_memo: str | None = None
    # The only folder under the job's prefix, holding the whole of its first
    # page (``d/<date>/`` under ``d/``): planned as its own prefix would be
    # after that page, not held back until two pages of its own as folders
    # are (most end within two).
    leads: bool = False


class Planner:
    """The ranges of one listing job and the cuts the names seen call for.

    Args:
        prefix: The job's prefix (folders listed on their own are prefixes of
            their ranges).
        parallelism: Most page requests in flight at once.
        page_size: Objects asked for per page.
        stats: Counts the ranges cut (``steals``).
        on_page: Called with the number of new objects kept from each page.
    """

    def __init__(
        self,
        prefix: str,
        *,
        parallelism: int,
        page_size: int,
        stats: ListingStats,
        on_page: Callable[[int], None] | None,
    ) -> None:
        self.prefix = prefix
        self.parallelism = parallelism
        self.page_size = page_size
        self.stats = stats
        self.on_page = on_page
        self.ranges: list[Range] = []
        self.probes: collections.deque[Range] = collections.deque()
        self.fills: collections.deque[Range] = collections.deque()
        self.starts: dict[str, Range] = {}  # ranges by start
        # Per listing prefix (the job's, or one of its folders).
        self.columns: collections.defaultdict[str, Columns] = collections.defaultdict(Columns)
        self.frontiers: collections.defaultdict[str, str] = collections.defaultdict(str)
        self.listed = 0
        # Probes of the top range that found names; searches answered, and found names.
        self.top_hits = 0
        self.searches = 0
        self.search_hits = 0
        # Whether the first page's names count up (see counted_up).
        self.counted = False

    def answered(self, r: Range, found: bool) -> None:
        """Count what ``r``'s page said, if ``r`` was cut off as a probe."""
        if r.probe == "top":
            self.top_hits += found
        else:
            self.searches += 1
            self.search_hits += found
        r.probe = None

    def pending(self) -> bool:
        """Whether anything is left to hand out or to list."""
        return bool(self.probes or self.fills) or not all(r.done for r in self.ranges)

    # -- names ------------------------------------------------------------------

    def take(self, r: Range, objects: list[ObjectInfo], *, taken_before: bool = False) -> bool:
        """Keep the page's names that belong to ``r``; whether it ran past its end.

        ``taken_before``: names already taken by another range (the job's first
        page, handed on to the folder it lies in): not counted again.
        """
        if not taken_before:
            self.listed += len(objects)
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
            if self.on_page is not None and not taken_before:
                self.on_page(len(kept))
        return past_end

    # -- cutting ----------------------------------------------------------------

    def _measure(self, r: Range, extra: str | None = None) -> tuple[KeyScale, int, int, int] | None:
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

    def _cut(self, r: Range, scale: KeyScale, targets: list[int], *, probe: bool) -> list[Range]:
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
            Range(start=key, end=nxt, prefix=r.prefix, sample=r.sample)
            for key, nxt in zip(keys, [*keys[1:], r.end])
        ]
        r.end = keys[0]
        self.ranges.extend(pieces)
        self.starts.update((p.start, p) for p in pieces if p.start is not None)
        self.stats.steals += len(pieces)
        logger.debug("listing %s: %s cut at %r", self.prefix, "probes" if probe else "fill", keys)
        return pieces

    def _fill(self, r: Range) -> None:
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
        targets = _pieces(pos, scale.value(r.end), page_num // page_den, count, r.in_flight)
        self.fills.extend(self._cut(r, scale, targets, probe=False))

    def _probe(self, r: Range) -> None:
        """Hand out ranges past ``r``'s names, where nobody knows whether names go on."""
        measured = self._measure(r)
        if measured is None:
            return
        scale, pos, page_num, page_den = measured
        pages = (scale.value(r.end) - pos) * page_den / page_num
        if pages < 2 * _PAGE_AIM:
            return
        offsets: list[float] = []
        targets: list[int] | None = None  # set directly where cut into even pieces
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
            if count == 1 and self.listed <= self.page_size:
                # After the first page the probe near the end finds names
                # only where they are spread (hashes), and the fan-out waits
                # for it a round.
                self.counted = counted_up([o.name for o in r.objects])
                if not self.counted and tail <= _SPREAD_PAGES:
                    # Spread: pieces of a page each right past the first
                    # page are listed meanwhile.
                    ahead = min(_AHEAD_PIECES, int(tail / _PAGE_AIM) - 1)
                    offsets = [_PAGE_AIM * i for i in range(1, ahead + 1)] + [tail]
                elif tail > _MIDWAY_PAGES:
                    # Packed at the start (counters): the far probe comes
                    # back empty and a search after it costs a round more; a
                    # probe midway (geometrically) finds them in this one.
                    offsets = _geometric(_PAGE_AIM, tail, 3)[1:]
        elif pages <= _PAGE_AIM * (_MAX_PROBES + 1) or (
            self.counted and pages <= _PAGE_AIM * (_COUNTED_PIECES + 1)
        ):
            # The names end within a few pages: pieces of a page each.
            count = int(pages / _PAGE_AIM) + 1
            targets = _pieces(pos, scale.value(r.end), page_num // page_den, count, r.in_flight)
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
            below = pos * page_den / page_num  # pages of key space below the cursor
            if self.counted and below >= _PAGE_AIM:
                # Counted names start near the start of the key space and end
                # at their count, anywhere between the cursor and r's end: as
                # likely at twice the cursor's count as at the next page. The
                # probes are a constant factor apart in position (counted
                # from the key space's start), not in distance from the
                # cursor, which crowded them right past it and left the end
                # to later rounds (100k counted names: 6 rounds, not 7;
                # 200k: 7, not 11; 2-4 requests more).
                offsets = [g - below for g in _geometric(below, below + pages, count + 2)[1:-1]]
        if targets is None:
            targets = [pos + round(g * 1000) * page_num // (page_den * 1000) for g in offsets]
        top = r.end is None  # (before the cut lowers it)
        pieces = self._cut(r, scale, targets, probe=True)
        for p in pieces:
            p.probe = "top" if top else "search"
        if top and pieces:
            # The far probe first: its answer says whether the rest can be cut.
            pieces = pieces[-1:] + pieces[:-1]
        self.probes.extend(pieces)

    def _search_hit_rate(self) -> float:
        """The fraction of answered searches that found names, one hit assumed."""
        return (self.search_hits + 1) / (self.searches + 1)

    def _far(self, r: Range, key: str) -> bool:
        """Whether ``key`` (past ``r``'s end) lies more than a page of ``r``'s names past it."""
        measured = self._measure(r, key)
        if measured is None:
            return True
        scale, _, page_num, page_den = measured
        return (scale.value(key) - scale.value(r.end)) * page_den > page_num

    def plan(self) -> None:
        """Cut what the names seen so far say can be cut.

        A range with a page of its own is cut once the range past its end has
        answered: into fill pieces when names go on right past its end, into
        probes when they do not (it came back empty, or its names start far
        on). A range whose first page is still in flight is cut into fill
        pieces on the density it was cut with, when names go on right past
        its end (the fan-out then waits for the far probe's answer, not for
        the last answer of its round). The top range (no end) is probed at
        once.
        """
        for r in self.ranges:  # pieces cut here join the loop, and are skipped
            if r.done or r.filled:
                continue
            if r.first is None:
                # Its first page is in flight: cut on the density it was cut
                # with, once names are found right past its end.
                if r.in_flight and r.end is not None and r.sample is not None:
                    above = self.starts[r.end]
                    if above.first is not None and r.early_memo != above.first:
                        r.early_memo = above.first
                        if not self._far(r, above.first):
                            self._fill(r)
                continue
            if r.first == r.cursor:
                continue
            if r.end is None:
                if r.prefix != self.prefix and not r.leads and len(r.objects) < 2 * self.page_size:
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

    def steal(self) -> Range | None:
        """Half of the range below the frontier with the most pages left, if any."""
        best: tuple[float, str, Range] | None = None
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
        thief = Range(start=cut, end=victim.end, prefix=victim.prefix, sample=victim.sample)
        victim.end = cut
        self.ranges.append(thief)
        self.starts[cut] = thief
        self.stats.steals += 1
        logger.debug("listing %s: range cut at %r", self.prefix, cut)
        return thief

    def next_range(self) -> Range | None:
        """The next range to list: a probe, else a fill piece, else half of one."""
        if self.probes:
            return self.probes.popleft()
        if self.fills:
            return self.fills.popleft()
        return self.steal()
