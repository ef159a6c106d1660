"""``BidiWriteObjectRequest`` data messages, serialized by hand with one copy.

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
"""

from __future__ import annotations

from typing import Any

__all__ = ["data_message", "finish_message", "serialize"]


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
