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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from torchbucket.listing._keyspace import Columns, KeyScale
from torchbucket.listing._probes import (
    COUNTED_PIECES,
    MAX_PROBES,
    PAGE_AIM,
    PIECES_PER_LISTER,
    SEARCH_HIT_RATE,
    TAIL_PAGES,
    counted_up,
    even_cuts,
    first_page_offsets,
    search_offsets,
    top_offsets,
)
from torchbucket.storage.base import ObjectInfo

__all__ = ["ListingStats", "Planner", "Range", "counted_up"]

logger = logging.getLogger(__name__)


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
        count = min(int(pages / PAGE_AIM) + 1, PIECES_PER_LISTER * self.parallelism)
        if count < 2 or pages < 1.2:
            return
        targets = even_cuts(pos, scale.value(r.end), page_num // page_den, count, r.in_flight)
        self.fills.extend(self._cut(r, scale, targets, probe=False))

    def _probe(self, r: Range) -> None:
        """Hand out ranges past ``r``'s names, where nobody knows whether names go on."""
        measured = self._measure(r)
        if measured is None:
            return
        scale, pos, page_num, page_den = measured
        pages = (scale.value(r.end) - pos) * page_den / page_num
        if pages < 2 * PAGE_AIM:
            return
        offsets: list[float] = []
        targets: list[int] | None = None  # set directly where cut into even pieces
        pages_listed = self.listed / self.page_size - 1.0
        if r.end is None:
            tail = pages - TAIL_PAGES
            if tail < 2 * PAGE_AIM:
                return
            offsets = top_offsets(tail, pages_listed, self.top_hits)
            if len(offsets) == 1 and self.listed <= self.page_size:
                self.counted = counted_up([o.name for o in r.objects])
                offsets = first_page_offsets(tail, counted=self.counted)
        elif pages <= PAGE_AIM * (MAX_PROBES + 1) or (
            self.counted and pages <= PAGE_AIM * (COUNTED_PIECES + 1)
        ):
            # The names end within a few pages: pieces of a page each.
            count = int(pages / PAGE_AIM) + 1
            targets = even_cuts(pos, scale.value(r.end), page_num // page_den, count, r.in_flight)
        else:
            below = pos * page_den / page_num  # pages of key space below the cursor
            offsets = search_offsets(
                pages, pages_listed, self._search_hit_rate(), counted=self.counted, below=below
            )
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
            if not near and r.in_flight and self._search_hit_rate() < SEARCH_HIT_RATE:
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
