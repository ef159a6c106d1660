"""Where the parallel lister cuts a range: its tuning and the probes' offsets.

The arithmetic half of :mod:`._ranges`' planner: how many probes go out and
how far past a range's names (in pages of its density), where fill pieces
are cut, and whether a first page's names count up. Pure functions of
numbers and names.
"""

from __future__ import annotations

import math

__all__ = [
    "AHEAD_PIECES",
    "COUNTED_PIECES",
    "MAX_PROBES",
    "PAGE_AIM",
    "PIECES_PER_LISTER",
    "SEARCH_HIT_RATE",
    "TAIL_PAGES",
    "counted_up",
    "even_cuts",
    "first_page_offsets",
    "geometric",
    "search_offsets",
    "top_offsets",
]

# A fill piece is aimed at this fraction of a page, so that the spread of the
# names around the estimate seldom pushes it onto a second page.
PAGE_AIM = 0.9
# The last probe starts this many pages short of where the names would end if
# the density measured held to the end of the key space.
TAIL_PAGES = 1.5
# Probes in flight at once: at most this many per page listed past the first,
# and at most MAX_PROBES.
PROBES_PER_PAGE = 2.0
MAX_PROBES = 8
# After a first page of names counted up (``img/000000.jpg``...), the top
# range also probes midway (geometrically) between the next page and the last
# probe when that spans more pages than this: 100k such names then fan out a
# round sooner (0.15 s, not 0.23 s, on the emulator's same-region latency) for
# one more request on a prefix of two pages (four, not three).
MIDWAY_PAGES = 16.0
# After a first page of names spread thinly over their key space (hashes),
# the top range also hands out up to this many pieces of a page each right
# past the first page, listed while the far probe finds where the names end:
# 100k hashed names fanned out at 0.07 s, not 0.15 s, with 16; with 32 the
# client parses them until the fan-out's first answers come (interleaved:
# idle 0.142 s, not 0.190 s; wall 0.522 s, not 0.590 s; 64 gained nothing
# more). Names spread evenly have them all, and a prefix of a few pages is
# predicted as such (no pieces); names spread thinly at first and packed
# further on leave some empty.
AHEAD_PIECES = 32
# ... unless the first page's density, held to the end of the key space,
# makes more pages than this (a billion objects): names packed under a stem
# the first page shares beyond the prefix (``d/20240101_<hash>``: 5.6e9
# pages) are not spread over the key space, and pieces past them would
# come back empty.
SPREAD_PAGES = 1_000_000.0
# A page is counted up when at least this fraction of its neighbouring names
# (a sample of) first differ at the deepest place any of them do.
COUNTED_UP = 0.5
COUNT_PAIRS = 64
# Past names counted up, a range whose names end within this many pieces of a
# page (the range past it came back empty) is cut into such pieces, not
# searched: counted names are dense up to their end, so each piece short of it
# is a page, where the search's probes, several pages apart, each needed a
# second page a round later (100k counted names on the emulator: idle 0.21 s,
# not 0.25-0.27 s, for 125 requests, not 122; on the memory store's count of
# rounds 30k, 130k and 170k of them end a round sooner, for 0-5 more).
COUNTED_PIECES = 16
# Probes of an exponential search past the end of the names: at least this
# many, else as many per page listed as above, up to one per doubling.
MIN_SEARCH = 4
# While fewer than this fraction of search probes find names (Laplace
# estimate), a range waits for its page in flight before searching past it.
SEARCH_HIT_RATE = 0.5
# A cut makes at most this many pieces per lister (a range of more pages than
# that is cut into pieces of several pages each, listed with page tokens).
PIECES_PER_LISTER = 4


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
    step = max(1, (len(names) - 1) // COUNT_PAIRS)
    places = []
    for i in range(0, len(names) - 1, step):
        a, b = names[i], names[i + 1]
        n = min(len(a), len(b))
        place = next((j for j in range(n) if a[j] != b[j]), n)
        places.append(place)
    deepest = max(places)
    return places.count(deepest) >= COUNTED_UP * len(places)


def even_cuts(pos: int, end: int, page: int, count: int, in_flight: bool) -> list[int]:
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


def geometric(first: float, last: float, count: int) -> list[float]:
    """``count`` offsets from ``first`` to ``last`` (one: ``last``), each a constant factor apart."""
    if count <= 1:
        return [last]
    ratio = (last / first) ** (1 / (count - 1))
    return [first * ratio**i for i in range(count - 1)] + [last]


def top_offsets(tail: float, pages_listed: float, top_hits: int) -> list[float]:
    """Probes past the top range's names (no end): where, in pages past its cursor.

    Near where they would end if the density held (spread names end there),
    and on the way there as far as the budget goes: no more than one probe
    more than twice those of the top range that found names (names in
    clusters, folders, leave most probes between them empty).
    """
    budget = max(1.0, PROBES_PER_PAGE * pages_listed)
    count = int(min(MAX_PROBES, budget, 1 + 2 * top_hits))
    return geometric(PAGE_AIM, tail, count)


def first_page_offsets(tail: float, *, counted: bool) -> list[float]:
    """Probes past the top range's first page, with one probe to spend.

    The probe near the end finds names only where they are spread (hashes),
    and the fan-out waits for it a round.
    """
    if not counted and tail <= SPREAD_PAGES:
        # Spread: pieces of a page each right past the first page are
        # listed meanwhile.
        ahead = min(AHEAD_PIECES, int(tail / PAGE_AIM) - 1)
        return [PAGE_AIM * i for i in range(1, ahead + 1)] + [tail]
    if tail > MIDWAY_PAGES:
        # Packed at the start (counters): the far probe comes back empty and
        # a search after it costs a round more; a probe midway
        # (geometrically) finds them in this one.
        return geometric(PAGE_AIM, tail, 3)[1:]
    return [tail]


def search_offsets(
    pages: float, pages_listed: float, hit_rate: float, *, counted: bool, below: float
) -> list[float]:
    """Probes past a range's names that end before its end, ``pages`` away.

    The range past it came back empty, or its names start far from it:
    double the distance with each probe, an exponential search in one round.
    Past the end of the names only a few come back empty, whichever the end.
    As many probes as doublings, fewer while few pages are listed: a prefix
    of a few pages costs a few empty requests, not ten. ``below``: pages of
    key space below the cursor.
    """
    count = min(
        math.ceil(math.log2(pages / PAGE_AIM)),
        int(max(MIN_SEARCH, PROBES_PER_PAGE * pages_listed) * hit_rate),
    )
    count = max(count, 1)
    if counted and below >= PAGE_AIM:
        # Counted names start near the start of the key space and end at
        # their count, anywhere between the cursor and the range's end: as
        # likely at twice the cursor's count as at the next page. The probes
        # are a constant factor apart in position (counted from the key
        # space's start), not in distance from the cursor, which crowded
        # them right past it and left the end to later rounds (100k counted
        # names: 6 rounds, not 7; 200k: 7, not 11; 2-4 requests more).
        return [g - below for g in geometric(below, below + pages, count + 2)[1:-1]]
    return geometric(PAGE_AIM, pages, count + 1)[:-1]
