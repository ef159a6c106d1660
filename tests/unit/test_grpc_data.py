"""The hand-serialized ``BidiWriteObjectRequest`` data messages parse as the protobuf class builds them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("grpc")

from torchbucket.storage.gcs._grpc_data import data_message, finish_message, serialize
from torchbucket.storage.gcs._grpc_wire import pb


@settings(max_examples=200, deadline=None)
@given(
    offset=st.integers(min_value=0, max_value=(1 << 63) - 1),
    content=st.binary(max_size=3000),
    crc=st.integers(min_value=0, max_value=(1 << 32) - 1),
    flush=st.booleans(),
)
def test_a_data_message_is_the_protobuf_message(
    offset: int, content: bytes, crc: int, flush: bool
) -> None:
    message, start = data_message(offset, memoryview(content), crc, flush=flush, state_lookup=flush)
    parsed = pb().BidiWriteObjectRequest.FromString(message)
    expected = pb().BidiWriteObjectRequest(write_offset=offset, flush=flush, state_lookup=flush)
    expected.checksummed_data.content = content
    expected.checksummed_data.crc32c = crc
    assert parsed == expected
    assert message[start : start + len(content)] == content


def test_a_large_content_keeps_its_bytes() -> None:
    content = bytes(range(256)) * 8192  # 2 MiB: a three-byte length
    message, start = data_message(5 << 30, content, 7)
    parsed = pb().BidiWriteObjectRequest.FromString(message)
    assert parsed.checksummed_data.content == content and parsed.write_offset == 5 << 30
    assert message[start:] == content


@given(
    offset=st.integers(min_value=0, max_value=(1 << 63) - 1),
    crc=st.integers(min_value=0, max_value=(1 << 32) - 1),
)
def test_a_finish_message_is_the_protobuf_message(offset: int, crc: int) -> None:
    parsed = pb().BidiWriteObjectRequest.FromString(finish_message(offset, crc))
    expected = pb().BidiWriteObjectRequest(write_offset=offset, finish_write=True)
    expected.object_checksums.crc32c = crc
    assert parsed == expected


def test_serialize_passes_bytes_and_serializes_messages() -> None:
    request = pb().BidiWriteObjectRequest(write_offset=3, flush=True)
    assert serialize(request) == request.SerializeToString()
    raw, _ = data_message(0, b"x", 1)
    assert serialize(raw) is raw


@settings(max_examples=200, deadline=None)
@given(
    content=st.binary(max_size=3000),
    crc=st.integers(min_value=0, max_value=(1 << 32) - 1),
    offset=st.integers(min_value=0, max_value=(1 << 63) - 1),
    read_id=st.integers(min_value=0, max_value=(1 << 62)),
    end=st.booleans(),
)
def test_the_emulators_range_message_is_the_protobuf_message(
    content: bytes, crc: int, offset: int, read_id: int, end: bool
) -> None:
    from torchbucket.emulator._grpc_read import range_message

    parsed = pb().BidiReadObjectResponse.FromString(
        range_message(content, crc, offset, read_id, end)
    )
    expected = pb().BidiReadObjectResponse()
    piece = expected.object_data_ranges.add()
    piece.checksummed_data.content = content
    piece.checksummed_data.crc32c = crc
    piece.read_range.read_offset = offset
    piece.read_range.read_length = len(content)
    piece.read_range.read_id = read_id
    piece.range_end = end
    assert parsed == expected


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(
            st.binary(max_size=3000),
            st.one_of(st.none(), st.integers(min_value=0, max_value=(1 << 32) - 1)),
            st.integers(min_value=0, max_value=(1 << 62)),
            st.integers(min_value=0, max_value=(1 << 62)),
            st.booleans(),
        ),
        min_size=1,
        max_size=3,
    ),
    metadata=st.booleans(),
)
def test_range_data_is_parsed_as_protobuf_parses_it(
    pieces: list[tuple[bytes, int | None, int, int, bool]], metadata: bool
) -> None:
    from torchbucket.storage.gcs._grpc_data import RangeData, read_response

    message = pb().BidiReadObjectResponse()
    for content, crc, offset, read_id, end in pieces:
        piece = message.object_data_ranges.add()
        piece.checksummed_data.content = content
        if crc is not None:
            piece.checksummed_data.crc32c = crc
        piece.read_range.read_offset = offset
        piece.read_range.read_length = len(content)
        piece.read_range.read_id = read_id
        piece.range_end = end
    if metadata:
        message.metadata.name = "o"
        message.read_handle.handle = b"h"
    got = read_response(pb().BidiReadObjectResponse)(message.SerializeToString())
    if metadata:  # anything beyond range data is protobuf's to parse
        assert got == message
        return
    assert isinstance(got, RangeData)
    assert [(r[0], r[1], bytes(r[2]), r[3], r[4]) for r in got.ranges] == [
        (read_id, offset, content, crc, end) for content, crc, offset, read_id, end in pieces
    ]
