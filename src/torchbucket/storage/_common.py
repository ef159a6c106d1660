"""Small helpers shared by the backends: ranges, argument checks.

Checksums are :mod:`torchbucket.storage.crc32c`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchbucket.storage.base import COMPOSE_MAX_SOURCES, MULTIPART_MAX_PARTS, ObjectInfo

__all__ = [
    "check_compose_sources",
    "check_page_size",
    "check_part_number",
    "check_range",
    "resolve_range",
]


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
