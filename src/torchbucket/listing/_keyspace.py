"""Key ranges as numbers: where to split a range of object names.

The parallel lister cuts the key space of one prefix into ranges that should
hold about as many names each, knowing only the names it has seen so far. This
module maps names to integers and back, so that "half way between these two
names" and "about k pages further on" become arithmetic.

Names compare as GCS orders them: by UTF-8 bytes, which is the order of code
points, which is Python's ``str`` order. A name becomes a number by dropping a
stem every name in play starts with, then reading the rest as a mixed-radix
number: the digit at each position is the character's rank among the
characters seen at that position (its *column*), and digit 0 means "the name
ended here", at positions where some name seen did end (elsewhere a name that
ends early counts as if padded with the lowest characters). Counting only the
characters seen, position by position, keeps the spacing of the numbers close
to the spacing of the names: six decimal digits followed by ``.jpg`` use radix
10 at the first six positions, not 1,114,112, and no key space is wasted on
``img/00j`` between ``img/009`` and ``img/01``, nor on ``img/01`` itself. The
map is monotone: ``a < b`` implies ``value(a) <= value(b)``, strictly for
names of the lengths seen, no longer than the depth.

Numbers map back to names only approximately (most numbers, such as one with
a "name ended" digit followed by more digits, are no name at all), so
:meth:`KeyScale.key_between` rounds to a real string and guarantees that it
lies strictly inside the range, or says that the range cannot be split. Nothing
here loops: a range between adjacent names (``"a"`` and ``"aa"`` over the
alphabet ``{"a"}``) is reported as unsplittable, and the caller lists it whole.

Everything here is pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Columns", "KeyScale", "common_prefix", "midpoint"]

# Extra positions beyond the longest name in play, so that two names differing
# only in their last character still have room between them.
_EXTRA_DEPTH = 2


def common_prefix(keys: Iterable[str]) -> str:
    """The longest string every key starts with (``""`` for no keys)."""
    keys = list(keys)
    if not keys:
        return ""
    # The common prefix of all is that of the least and the greatest.
    lo, hi = min(keys), max(keys)
    n = 0
    for a, b in zip(lo, hi):
        if a != b:
            break
        n += 1
    return lo[:n]


_DIGITS = frozenset("0123456789")


def _widen(column: set[str], numeric: frozenset[str]) -> set[str]:
    """The characters a position may hold, from those seen there.

    A position seen holding a digit may hold any digit, and any character seen
    at another position that held digits: counters carry (the names seen so far
    may all start ``img/000``, those to come ``img/001``), and a hash whose
    first character was ``0`` on the first page has ``a``-``f`` at other
    positions. Letters seen fill the span between the lowest and the highest
    of their case (hex digits ``a``-``f`` stay ``a``-``f``).
    """
    out = set(column)
    if not out.isdisjoint(_DIGITS):
        out |= _DIGITS | numeric
    for lo, hi in (("a", "z"), ("A", "Z")):
        seen = [ch for ch in column if lo <= ch <= hi]
        if len(seen) > 1:
            out.update(chr(c) for c in range(ord(min(seen)), ord(max(seen)) + 1))
    return out


_Digits = tuple[list[str], dict[str, int]]


def _digits(chars: Iterable[str]) -> _Digits:
    ordered = sorted(chars)
    return ordered, {ch: d + 1 for d, ch in enumerate(ordered)}


class Columns:
    """The characters seen at each position of names, after the listing prefix.

    The lister feeds it samples of the names it lists; :class:`KeyScale` reads
    from it which characters each position may hold.
    """

    __slots__ = ("_cache", "_ends", "_numeric", "_seen", "version")

    def __init__(self, suffixes: Iterable[str] = ()) -> None:
        self._seen: list[set[str]] = []
        # Positions at which some name seen ended (its length).
        self._ends: set[int] = set()
        self._cache: list[_Digits] | None = None
        self._numeric: frozenset[str] = frozenset()
        #: Counts the changes: anything computed from the columns is stale
        #: once it moves.
        self.version = 0
        self.update(list(suffixes))

    def __len__(self) -> int:
        return len(self._seen)

    def update(self, suffixes: Sequence[str]) -> None:
        """Add the characters at each position of ``suffixes`` (names less the prefix)."""
        if not suffixes:
            return
        seen, ends = self._seen, self._ends
        before = sum(len(c) for c in seen) + len(ends)
        longest = max(len(s) for s in suffixes)
        while len(seen) < longest:
            seen.append(set())
        if all(len(s) == longest for s in suffixes):
            for column, chars in zip(seen, zip(*suffixes)):
                column.update(chars)
            ends.add(longest)
        else:
            for s in suffixes:
                for column, ch in zip(seen, s):
                    column.add(ch)
            ends.update(len(s) for s in suffixes)
        if sum(len(c) for c in seen) + len(ends) != before:
            self._cache = None
            self.version += 1

    def position(self, i: int) -> _Digits | None:
        """Sorted characters position ``i`` may hold and their digits, if ever seen."""
        if i >= len(self._seen):
            return None
        if self._cache is None:
            self._refresh()
        assert self._cache is not None
        return self._cache[i]

    def closed(self, i: int) -> bool:
        """Whether position ``i`` held a character in every name seen (none ended there)."""
        return i < len(self._seen) and i not in self._ends

    @property
    def numeric(self) -> frozenset[str]:
        """Every character seen at a position that also held a digit."""
        if self._cache is None:
            self._refresh()
        return self._numeric

    def _refresh(self) -> None:
        self._numeric = frozenset().union(*(c for c in self._seen if not _DIGITS.isdisjoint(c)))
        self._cache = [_digits(_widen(c, self._numeric)) for c in self._seen]


class KeyScale:
    """A monotone map between names under a common stem and integers.

    Args:
        keys: The names (or bounds) that values will be asked of. All of them
            must be given here; their characters join the columns.
        prefix: The listing prefix; every key starts with it, and so does every
            key made here.
        columns: Characters seen at each position after ``prefix`` in other
            names.
        alphabet: Characters any position may hold, besides those of the
            columns and the keys.
        strip_common: Count from the prefix common to all keys (compact, for a
            range between two known names) rather than from ``prefix`` (for
            extrapolating past the last name, which may leave that common
            prefix).

    Attributes:
        stem: What every key starts with (at least ``prefix``).
        top: A value above that of every key with the stem: the end of the
            stem's key space, for a range without an upper bound.
    """

    __slots__ = ("_chars", "_digits", "_open", "_radix", "stem", "top")

    def __init__(
        self,
        keys: Iterable[str],
        *,
        prefix: str = "",
        columns: Columns | None = None,
        alphabet: Iterable[str] = (),
        strip_common: bool = True,
    ) -> None:
        keys = list(keys)
        for key in keys:
            if not key.startswith(prefix):
                raise ValueError(f"key {key!r} does not start with prefix {prefix!r}")
        self.stem = common_prefix(keys) if keys and strip_common else prefix
        cut = len(self.stem)
        skip = cut - len(prefix)  # positions of the columns that the stem covers
        suffixes = [k[cut:] for k in keys]
        depth = max((len(s) for s in suffixes), default=0) + _EXTRA_DEPTH
        extra = frozenset(alphabet)
        numeric = columns.numeric if columns is not None else frozenset()
        fallback: _Digits | None = None
        digits: list[_Digits] = []
        is_open: list[bool] = []
        for i in range(depth):
            # A position where no name seen has ended gets no digit for "the
            # name ended here": fixed-length names (counters, hashes) would
            # otherwise leave a gap of 1/radix at the start of every block of
            # the key space, and ranges cut evenly by value would hold uneven
            # numbers of names. A key that ends there counts as if it went on
            # with the lowest characters (the map stays monotone).
            is_open.append(columns is None or not columns.closed(skip + i))
            seen = columns.position(skip + i) if columns is not None else None
            here = {s[i] for s in suffixes if i < len(s)} | extra
            if seen is not None and all(ch in seen[1] for ch in here):
                digits.append(seen)
            elif seen is not None or here:
                base = set(seen[0]) if seen is not None else set()
                digits.append(_digits(_widen(base | here, numeric)))
            else:
                if fallback is None:
                    fallback = _digits(extra.union(*suffixes))
                digits.append(fallback)
        chars = [d[0] for d in digits]
        self._chars = chars
        self._digits = [d[1] for d in digits]
        self._open = is_open
        self._radix = [len(col) + int(o) for col, o in zip(chars, is_open)]
        top = 1
        for radix in self._radix:
            top *= radix
        self.top = top

    def value(self, key: str | None) -> int:
        """The number of ``key``; ``None`` (no upper bound) maps to :attr:`top`.

        Raises:
            ValueError: ``key`` does not start with the stem, or holds a
                character that is in no column at its position (it was not
                given at construction).
        """
        if key is None:
            return self.top
        if not key.startswith(self.stem):
            raise ValueError(f"key {key!r} does not start with {self.stem!r}")
        rest = key[len(self.stem) :]
        value = 0
        for i, radix in enumerate(self._radix):
            digit = 0
            if i < len(rest):
                digit = self._digits[i].get(rest[i], -1)
                if digit < 0:
                    raise ValueError(f"character {rest[i]!r} of {key!r} is not in the scale")
                if not self._open[i]:
                    digit -= 1
            value = value * radix + digit
        return value

    def _round(self, value: int, *, up: bool) -> str:
        """The string at ``value``, rounded down or up to a real string."""
        digits: list[int] = []
        for radix in reversed(self._radix):
            value, digit = divmod(value, radix)
            digits.append(digit)
        digits.reverse()
        out: list[str] = []
        for i, digit in enumerate(digits):
            if not self._open[i]:
                out.append(self._chars[i][digit])
                continue
            if digit == 0:
                # "The name ends here": a real string unless more digits follow.
                # Rounding down ends it; rounding up takes the smallest character
                # that continues it, which is above everything that ends here.
                if up and any(digits[i + 1 :]):
                    out.append(self._chars[i][0])
                break
            out.append(self._chars[i][digit - 1])
        return self.stem + "".join(out)

    def key_between(self, value: int, lo: str | None, hi: str | None) -> str | None:
        """A string strictly between ``lo`` and ``hi``, near ``value``.

        Args:
            value: Where the string should be, as a number of this scale.
            lo: Lower bound (exclusive), or ``None`` for the stem itself.
            hi: Upper bound (exclusive), or ``None`` for the end of the stem's
                key space.

        Returns:
            A string ``s`` with ``lo < s`` and ``s < hi`` (where given), starting
            with the stem; ``None`` if this scale has no string in between.
        """
        v_lo = self.value(lo) if lo is not None else 0
        v_hi = self.value(hi)
        for target in (value, (v_lo + v_hi) // 2):
            target = max(min(target, v_hi - 1), v_lo)
            for up in (False, True):
                candidate = self._round(target, up=up)
                if (lo is None or candidate > lo) and (hi is None or candidate < hi):
                    return candidate
        return None


def midpoint(
    lo: str, hi: str | None, *, prefix: str = "", alphabet: Iterable[str] = ()
) -> str | None:
    """A name half way between ``lo`` and ``hi`` (exclusive both), or ``None``.

    Args:
        lo: Lower bound; starts with ``prefix``.
        hi: Upper bound, or ``None`` for the end of the prefix's key space.
        prefix: The listing prefix the result must start with.
        alphabet: Characters to count as digits besides those of the bounds.

    Returns:
        A string strictly inside ``(lo, hi)`` that starts with ``prefix``, or
        ``None`` when no string over the alphabet lies in between.
    """
    if not lo.startswith(prefix) or (hi is not None and not hi.startswith(prefix)):
        raise ValueError(f"bounds {lo!r}, {hi!r} do not start with prefix {prefix!r}")
    keys = [lo] if hi is None else [lo, hi]
    scale = KeyScale(keys, prefix=prefix, alphabet=alphabet, strip_common=hi is not None)
    return scale.key_between((scale.value(lo) + scale.value(hi)) // 2, lo, hi)
