"""The data messages of the gRPC path, serialized and parsed by hand.

Writes: ``BidiWriteObjectRequest`` data messages serialized with one copy.
Reads: ``BidiReadObjectResponse`` range data parsed without one
(:func:`read_response`).

A data message is almost all content: building it as a protobuf message
copies the content into the message, and serializing copies it again (with a
fresh 2 MiB allocation each time, its pages faulted in). Written here in
protobuf's wire format (google.storage.v2's storage.proto: ``write_offset``
= 3, ``checksummed_data`` = 4 with ``content`` = 1 and ``crc32c`` = 2,
``object_checksums`` = 6 with ``crc32c`` = 1, ``state_lookup`` = 7, ``flush``
= 8, ``finish_write`` = 9), the content is copied once, from the caller's
buffer into the message gRPC sends; the channel's serializer passes such
``bytes`` through (:func:`serialize`). ``tests/unit`` checks that the
message parses to the same fields as the protobuf class builds.

Also :class:`Meta`, what an ``Object`` message says of the object (a read
stream's first answer, a write stream's last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Meta",
    "Range",
    "RangeData",
    "data_message",
    "finish_message",
    "meta_of",
    "read_response",
    "serialize",
]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fixed32(value: int) -> bytes:
    return value.to_bytes(4, "little")


def data_message(
    offset: int,
    content: bytes | memoryview,
    crc: int,
    *,
    flush: bool = False,
    state_lookup: bool = False,
) -> tuple[bytes, int]:
    """A serialized ``BidiWriteObjectRequest`` carrying ``content`` (with its CRC32C ``crc``) at ``offset``.

    Returns:
        The message, and where in it the content starts.
    """
    n = len(content)
    length = _varint(n)
    inner = 5 + 1 + len(length) + n  # crc32c (tag + 4), content (tag, length, bytes)
    prefix = b"".join(
        (b"\x18", _varint(offset), b"\x22", _varint(inner), b"\x15", _fixed32(crc), b"\x0a", length)
    )
    suffix = (b"\x38\x01" if state_lookup else b"") + (b"\x40\x01" if flush else b"")
    return b"".join((prefix, content, suffix)), len(prefix)


def finish_message(offset: int, object_crc: int) -> bytes:
    """A serialized ``BidiWriteObjectRequest`` that finalizes at ``offset``, the object's CRC32C given."""
    return b"".join((b"\x18", _varint(offset), b"\x32\x05\x0d", _fixed32(object_crc), b"\x48\x01"))


def serialize(request: Any) -> bytes:
    """The channel's request serializer: a message already serialized passes as it is."""
    if type(request) is bytes:
        return request
    return request.SerializeToString()  # type: ignore[no-any-return]


#: ``(read_id, read_offset, content, crc32c or None, range_end)`` of one range's data.
Range = tuple[int, int, "bytes | memoryview", "int | None", bool]


class RangeData:
    """A ``BidiReadObjectResponse`` that carries only range data, parsed by hand.

    ``ranges``: ``(read_id, read_offset, content, crc32c or None, range_end)``
    each, the content a read-only view of the message gRPC received (no copy:
    protobuf's parse would copy every chunk into a new 2 MiB ``bytes``, the
    largest single cost of receiving a checkpoint load after the socket).
    """

    __slots__ = ("ranges",)

    def __init__(self, ranges: list[Range]) -> None:
        self.ranges = ranges


class _Other(Exception):
    """A field the hand parser leaves to protobuf."""


def _read_varint(buf: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(buf: memoryview) -> list[tuple[int, int, Any]]:
    """``(field, wire type, value)`` of a message: varints as ints, fixed32 as
    ints, length-delimited fields as views; other wire types are not expected."""
    out, at, end = [], 0, len(buf)
    while at < end:
        key, at = _read_varint(buf, at)
        field, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _read_varint(buf, at)
        elif wire == 2:
            n, at = _read_varint(buf, at)
            if at + n > end:
                raise _Other
            value, at = buf[at : at + n], at + n
        elif wire == 5:
            value, at = int.from_bytes(buf[at : at + 4], "little"), at + 4
        else:
            raise _Other
        out.append((field, wire, value))
    if at != end:
        raise _Other
    return out


def _range(buf: memoryview) -> Range:
    read_id = offset = 0
    content, crc, end = memoryview(b""), None, False
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2:  # checksummed_data
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    content = v
                elif f == 2 and w == 5:
                    crc = v
                else:
                    raise _Other
        elif field == 2 and wire == 2:  # read_range
            for f, w, v in _fields(value):
                if w != 0:
                    raise _Other
                if f == 1:
                    offset = v
                elif f == 3:
                    read_id = v
        elif field == 3 and wire == 0:
            end = bool(value)
        else:
            raise _Other
    return read_id, offset, content, crc, end


def read_response(message_class: Any) -> Any:
    """The channel's ``BidiReadObject`` deserializer: a :class:`RangeData` for a
    message of range data alone, else the protobuf message (metadata, a read
    handle, anything this parser does not know: protobuf parses it)."""

    def deserialize(raw: bytes) -> Any:
        try:
            buf = memoryview(raw)
            fields = _fields(buf)
            if fields and all(f == 6 and w == 2 for f, w, _ in fields):
                return RangeData([_range(v) for _, _, v in fields])
        except (_Other, IndexError):
            pass
        return message_class.FromString(raw)

    return deserialize


@dataclass(frozen=True, slots=True)
class Meta:
    """What the first message of a read stream says about the object."""

    size: int
    generation: int
    crc32c: int | None
    metadata: dict[str, str]
    content_type: str
    finalized: bool
    #: ``"gzip"`` for an object stored gzip-encoded (gRPC serves its stored bytes).
    content_encoding: str = ""


def meta_of(obj: Any) -> Meta:
    """A :class:`Meta` from a v2 ``Object``."""
    return Meta(
        size=obj.size,
        generation=obj.generation,
        crc32c=obj.checksums.crc32c if obj.checksums.HasField("crc32c") else None,
        metadata=dict(obj.metadata),
        content_type=obj.content_type,
        finalized=obj.HasField("finalize_time"),
        content_encoding=obj.content_encoding,
    )
