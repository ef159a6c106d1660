"""Key-range arithmetic: split points always lie strictly inside their range."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbucket.listing._keyspace import Columns, KeyScale, common_prefix, midpoint

# Names as they occur: mostly printable ASCII, some below "0" and above "z",
# some multi-byte UTF-8 (2, 3 and 4 bytes), no surrogates.
_CHARS = st.sampled_from([*"ab0z9._-/ ~", "\x01", "é", "中", "\U0001f600"])
_NAMES = st.text(_CHARS, min_size=0, max_size=12)


def _utf8_order(a: str, b: str) -> bool:
    return a.encode() < b.encode()


def test_common_prefix() -> None:
    assert common_prefix(["img/001", "img/0", "img/01"]) == "img/0"
    assert common_prefix(["a"]) == "a"
    assert common_prefix([]) == ""
    assert common_prefix(["x", "y"]) == ""


@given(_NAMES, _NAMES)
def test_python_order_is_utf8_byte_order(a: str, b: str) -> None:
    # The splitter compares with str; GCS compares bytes. They must agree.
    assert (a < b) == _utf8_order(a, b)


@settings(max_examples=300, deadline=None)
@given(_NAMES, _NAMES, st.sets(_CHARS, max_size=4))
def test_midpoint_is_strictly_inside(a: str, b: str, extra: set[str]) -> None:
    lo, hi = min(a, b), max(a, b)
    cut = midpoint(lo, hi, alphabet=extra)
    if cut is not None:
        assert lo < cut < hi
    if lo == hi:
        assert cut is None


@settings(max_examples=200, deadline=None)
@given(_NAMES, _NAMES)
def test_midpoint_under_a_prefix_stays_under_it(a: str, b: str) -> None:
    prefix = "data/"
    lo = prefix + min(a, b)
    cut = midpoint(lo, None, prefix=prefix, alphabet="az")
    assert cut is not None
    assert cut > lo
    assert cut.startswith(prefix)


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        ("a", "aa"),  # adjacent over the alphabet {"a"}: nothing in between
        ("aaa", "aaaa"),
        ("x", "x\x01"),
    ],
)
def test_ranges_that_cannot_be_split_say_so(lo: str, hi: str) -> None:
    assert midpoint(lo, hi) is None


def test_one_character_alphabet_splits_by_length() -> None:
    cut = midpoint("a", "aaaaaa")
    assert cut is not None and "a" < cut < "aaaaaa"
    assert set(cut) == {"a"}


def test_long_shared_prefix_costs_nothing() -> None:
    stem = "x" * 900 + "/"
    cut = midpoint(stem + "000", stem + "999")
    assert cut is not None and cut.startswith(stem)
    assert stem + "000" < cut < stem + "999"


def test_names_that_are_prefixes_of_others() -> None:
    cut = midpoint("img", "img/zzz")
    assert cut is not None and "img" < cut < "img/zzz"


def test_multibyte_characters() -> None:
    cut = midpoint("数据/a", "数据/中")
    assert cut is not None and "数据/a" < cut < "数据/中"
    cut.encode("utf-8")  # a string GCS accepts as an offset


def test_characters_below_zero_and_above_z() -> None:
    cut = midpoint("!!!", "~~~")
    assert cut is not None and "!!!" < cut < "~~~"


def test_value_is_monotone_and_round_trips_known_names() -> None:
    names = sorted(f"img/{i:04d}.jpg" for i in range(0, 10_000, 37))
    columns = Columns(n[4:] for n in names)
    scale = KeyScale(names, prefix="img/", columns=columns, strip_common=False)
    values = [scale.value(n) for n in names]
    assert values == sorted(values) and len(set(values)) == len(values)


def test_extrapolation_follows_a_decimal_counter() -> None:
    # Page 1 of img/000000..img/000999: the columns have only seen "000" in
    # front, yet "two pages further on" must land near img/002999.
    first = [f"img/{i:06d}.jpg" for i in range(1000)]
    columns = Columns(n[4:] for n in first)
    scale = KeyScale([first[0], first[-1]], prefix="img/", columns=columns, strip_common=False)
    width = scale.value(first[-1]) - scale.value(first[0])
    cut = scale.key_between(scale.value(first[-1]) + 2 * width, first[-1], None)
    assert cut is not None
    assert "img/002500" < cut < "img/003500"


def test_extrapolation_follows_hex_digits_past_nine() -> None:
    # Hashed names: the first page covers 0000-03ff, but the first character
    # will run through a-f, as the other positions already show.
    first = [f"img/{i:04x}{(i * 7919) % 65536:04x}.jpg" for i in range(0, 1024)]
    columns = Columns(n[4:] for n in first)
    scale = KeyScale([first[0], first[-1]], prefix="img/", columns=columns, strip_common=False)
    width = scale.value(first[-1]) - scale.value(first[0])
    cut = scale.key_between(scale.value(first[-1]) + 48 * width, first[-1], None)
    assert cut is not None and cut[4] in "abcdef"


def test_key_between_never_leaves_the_range() -> None:
    scale = KeyScale(["p/b", "p/d"], prefix="p/")
    for target in (-10, 0, scale.value("p/b"), scale.value("p/d"), scale.top * 2):
        cut = scale.key_between(target, "p/b", "p/d")
        assert cut is None or "p/b" < cut < "p/d"


def test_key_not_starting_with_prefix_is_rejected() -> None:
    with pytest.raises(ValueError, match="prefix"):
        KeyScale(["a/1", "b/2"], prefix="a/")
    with pytest.raises(ValueError, match="prefix"):
        midpoint("a/1", "b/2", prefix="a/")


def test_fixed_length_names_map_evenly_across_blocks() -> None:
    # No name seen ends inside the counter, so no key space goes to names that
    # would: img/000999 -> img/001000 is one step like any other, and a range
    # cut evenly by value holds as many names as any other.
    names = [f"img/{i:06d}.jpg" for i in range(3000)]
    columns = Columns(n[4:] for n in names)
    scale = KeyScale([names[0], names[-1]], prefix="img/", columns=columns, strip_common=False)
    steps = {scale.value(b) - scale.value(a) for a, b in itertools.pairwise(names)}
    assert len(steps) == 1
    # A key that ends early still sorts: it counts as if padded.
    assert scale.value("img/00") <= scale.value("img/001000.jpg")
    for target in (scale.value(names[999]) + 1, scale.value(names[2000]) - 1):
        cut = scale.key_between(target, names[500], names[2500])
        assert cut is not None and names[500] < cut < names[2500]
