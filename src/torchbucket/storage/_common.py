"""Small helpers shared by the backends: checksums, ranges, argument checks."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import google_crc32c

from torchbucket.storage.base import COMPOSE_MAX_SOURCES, MULTIPART_MAX_PARTS, ObjectInfo

__all__ = [
    "check_compose_sources",
    "check_page_size",
    "check_part_number",
    "check_range",
    "crc32c_b64",
    "crc32c_combine_bytes",
    "resolve_range",
]


def crc32c_b64(data: bytes | bytearray | memoryview) -> str:
    """CRC32C of ``data`` as GCS reports it: base64 of the big-endian 4 bytes."""
    # google-crc32c takes read-only buffers only: bytes, not bytearray or memoryview.
    value = google_crc32c.value(data if isinstance(data, bytes) else bytes(data))
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def crc32c_combine_bytes(chunks: Sequence[bytes | bytearray | memoryview]) -> str:
    """CRC32C of the concatenation of ``chunks``, without joining them."""
    crc: int = 0
    for chunk in chunks:
        crc = google_crc32c.extend(crc, chunk if isinstance(chunk, bytes) else bytes(chunk))
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def check_range(start: int, end: int | None) -> None:
    """Reject a byte range ``[start, end)`` no object has: the one check of every backend.

    Raises:
        ValueError: A negative start, or an end before the start.
    """
    if start < 0:
        raise ValueError(f"range start must be >= 0, got {start}")
    if end is not None and end < start:
        raise ValueError(f"range end {end} is before start {start}")


def check_page_size(page_size: int) -> None:
    """Reject a list page size below 1: the one check of every backend.

    Raises:
        ValueError: ``page_size`` is below 1.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")


def resolve_range(size: int, start: int, end: int | None) -> tuple[int, int]:
    """Clamp ``[start, end)`` to an object of ``size`` bytes (checked first).

    Raises:
        ValueError: A negative start, or an end before the start.
    """
    check_range(start, end)
    stop = size if end is None else min(end, size)
    return min(start, size), max(min(start, size), stop)


def check_compose_sources(sources: Sequence[ObjectInfo]) -> None:
    """Reject an empty or oversized compose request before it reaches a server."""
    if not sources:
        raise ValueError("compose needs at least one source object")
    if len(sources) > COMPOSE_MAX_SOURCES:
        raise ValueError(f"compose takes at most {COMPOSE_MAX_SOURCES} sources, got {len(sources)}")


def check_part_number(number: int) -> None:
    """Reject a part number outside 1..10,000."""
    if not 1 <= number <= MULTIPART_MAX_PARTS:
        raise ValueError(f"part number must be in 1..{MULTIPART_MAX_PARTS}, got {number}")
