"""``storage.crc32c``: the one place a CRC32C is computed and written as GCS writes it."""

from __future__ import annotations

import base64

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchbucket.storage.crc32c import b64, crc32c_b64, from_b64


def _reference(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode("ascii")


@given(st.binary(max_size=4096))
def test_every_buffer_type_gives_the_checksum_gcs_reports(data: bytes) -> None:
    expected = _reference(data)
    assert crc32c_b64(data) == expected
    assert crc32c_b64(bytearray(data)) == expected  # writable: checksummed in place
    assert crc32c_b64(memoryview(bytearray(data))) == expected
    assert crc32c_b64(memoryview(data)) == expected  # read-only, not bytes


def test_a_writable_buffer_is_left_as_it_was() -> None:
    buffer = bytearray(range(256)) * 8192  # 2 MiB: past the copying path's pieces
    before = bytes(buffer)
    assert crc32c_b64(buffer) == _reference(before)
    assert buffer == before


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_from_b64_reads_what_b64_writes(value: int) -> None:
    assert from_b64(b64(value)) == value


@pytest.mark.parametrize("text", ["", "AAAA", "AAAAAAAA", "not base64!", "AAAAAAA="])
def test_from_b64_rejects_what_is_not_four_bytes(text: str) -> None:
    with pytest.raises(ValueError):
        from_b64(text)
