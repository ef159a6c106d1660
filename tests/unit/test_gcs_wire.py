"""Pure helpers of the GCS backend: object resources, name quoting and header parsing."""

from __future__ import annotations

import pickle
from urllib.parse import quote, unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs._wire import (
    content_range,
    crc32c_of,
    hash_header_crc32c,
    object_info,
    object_infos,
    quote_name,
    range_header,
    stream_end,
)


@given(st.text())
def test_quote_name_encodes_like_quote_with_nothing_safe(name: str) -> None:
    quoted = quote_name(name)
    assert quoted == quote(name, safe="")
    assert unquote(quoted) == name


def test_quote_name_encodes_slashes_and_reserved_characters() -> None:
    assert quote_name("train/img_001.jpg") == "train%2Fimg_001.jpg"
    assert quote_name("a b#?%+") == "a%20b%23%3F%25%2B"


def test_crc32c_is_found_among_several_hashes() -> None:
    assert hash_header_crc32c({"x-goog-hash": "crc32c=n03x6A==,md5=Ojk9c3dhfxgoKVVHYwFbHQ=="}) == (
        "n03x6A=="
    )
    assert hash_header_crc32c({"x-goog-hash": "md5=abc, crc32c=AAAAAA=="}) == "AAAAAA=="
    two = CIMultiDict([("x-goog-hash", "md5=abc"), ("x-goog-hash", "crc32c=BBBBBB==")])
    assert hash_header_crc32c(two) == "BBBBBB=="
    assert hash_header_crc32c({"x-goog-hash": "md5=abc"}) is None
    assert hash_header_crc32c({}) is None


def test_content_range() -> None:
    assert content_range({"Content-Range": "bytes 10-19/1000"}) == (10, 19, 1000)
    assert content_range({"Content-Range": "bytes 0-9/*"}) == (0, 9, None)
    assert content_range({"Content-Range": "bytes */1000"}) is None
    assert content_range({}) is None


def test_range_header_and_stream_end() -> None:
    assert range_header(0, None) is None
    assert range_header(5, None) == {"Range": "bytes=5-"}
    assert range_header(0, 10) == {"Range": "bytes=0-9"}
    assert stream_end(None, None) is None
    assert stream_end(50, None) == 50
    assert stream_end(None, 30) == 30
    assert stream_end(50, 30) == 30


@given(
    st.text(min_size=1),
    st.integers(0, 2**63),
    st.none() | st.integers(1, 2**63),
    st.none() | st.text(),
    st.none() | st.sampled_from(["STANDARD", "NEARLINE"]),
)
def test_object_resources_become_object_info_equal_to_one_built_normally(
    name: str, size: int, generation: int | None, crc: str | None, klass: str | None
) -> None:
    doc: dict[str, str] = {"name": name, "size": str(size)}
    if generation is not None:
        doc["generation"] = str(generation)
    if crc is not None:
        doc["crc32c"] = crc
    if klass is not None:
        doc["storageClass"] = klass
    expected = ObjectInfo(name, size, generation, crc, klass)
    info = object_info(doc)
    assert info == expected and hash(info) == hash(expected) and repr(info) == repr(expected)
    assert object_infos([doc, doc]) == [expected, expected]
    assert pickle.loads(pickle.dumps(info)) == expected


def test_an_object_resource_without_size_has_size_zero() -> None:
    assert object_info({"name": "k"}) == ObjectInfo("k", 0)


@given(st.binary(max_size=5000), st.integers(0, 5000), st.booleans())
def test_crc32c_of_any_buffer_is_that_of_its_bytes(data: bytes, cut: int, native: bool) -> None:
    import google_crc32c

    from torchbucket.storage import crc32c as _crc32c

    expected = google_crc32c.value(data)
    saved = _crc32c._native
    if not native:
        _crc32c._native = None  # the copying path, as where the library is missing
    try:
        for buffer in (data, bytearray(data), memoryview(bytearray(data)), memoryview(data)):
            assert crc32c_of(buffer) == _crc32c.b64(expected)
            view = memoryview(buffer)
            at = min(cut, len(view))
            assert _crc32c.extend(_crc32c.extend(0, view[:at]), view[at:]) == expected
    finally:
        _crc32c._native = saved


def test_the_native_crc32c_library_is_found() -> None:
    # Without it every part of a checkpoint is copied to be checksummed.
    from torchbucket.storage import crc32c as _crc32c

    assert _crc32c._native is not None


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_crc32c_combine_is_the_crc32c_of_the_concatenation(a: bytes, b: bytes) -> None:
    import google_crc32c

    from torchbucket.storage.crc32c import combine

    value = google_crc32c.value
    assert combine(value(a), value(b), len(b)) == value(a + b)


def test_crc32c_combine_of_large_lengths() -> None:
    import google_crc32c

    from torchbucket.storage.crc32c import combine

    a, b = bytes(range(256)) * 7, bytes(range(251)) * 25_000  # b spans many length bits
    value = google_crc32c.value
    assert combine(value(a), value(b), len(b)) == value(a + b)


@pytest.mark.parametrize("native", [True, False])
def test_crc32c_combine_on_both_sides_of_the_zero_run_limit(native: bool) -> None:
    # Up to _ZEROS_UP_TO the native library runs A's CRC over zeros; beyond
    # it (and without the library) the power of x is multiplied in Python.
    import random

    import google_crc32c

    from torchbucket.storage import crc32c as _crc32c

    limit = _crc32c._ZEROS_UP_TO
    rng = random.Random(7)
    saved = _crc32c._native
    if not native:
        _crc32c._native = None
    try:
        for len_b in (0, 1, 7, 512, limit - 1, limit, limit + 1):
            a, b = rng.randbytes(rng.randrange(0, 300)), rng.randbytes(len_b)
            value = google_crc32c.value
            assert _crc32c.combine(value(a), value(b), len_b) == value(a + b), len_b
            crc_a = rng.getrandbits(32)
            by_power = _crc32c._multiply(_crc32c._shift(len_b), crc_a) ^ 0x1234
            assert _crc32c.combine(crc_a, 0x1234, len_b) == by_power, len_b
    finally:
        _crc32c._native = saved


@pytest.mark.parametrize("native", [True, False])
def test_crc32c_combine_refuses_a_negative_length(native: bool) -> None:
    # A size read from a listing is not to be trusted: -1 must not reach the
    # native library (a read of 2^64 - 1 bytes) nor the multiplication (no end).
    from torchbucket.storage import crc32c as _crc32c

    saved = _crc32c._native
    if not native:
        _crc32c._native = None
    try:
        with pytest.raises(ValueError, match="length >= 0, got -1"):
            _crc32c.combine(1, 2, -1)
    finally:
        _crc32c._native = saved


def test_crc32c_combine_of_a_composite_of_equal_sources() -> None:
    # A composite's sources mostly share one length: every combine after the
    # first takes the cached shift, and the chain still equals the whole's CRC.
    import google_crc32c

    from torchbucket.storage.crc32c import combine

    pieces = [bytes([i]) * 10_240 + i.to_bytes(4, "big") for i in range(32)]
    crc = 0
    for piece in pieces:
        crc = combine(crc, google_crc32c.value(piece), len(piece))
    assert crc == google_crc32c.value(b"".join(pieces))
