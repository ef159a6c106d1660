"""Byte-range merging for partial reads."""

from __future__ import annotations

from collections.abc import Iterable

from torchbucket.errors import ConfigError

__all__ = ["merge_ranges"]


def merge_ranges(ranges: Iterable[tuple[int, int]], max_gap: int = 0) -> list[tuple[int, int]]:
    """Merge half-open ``[start, end)`` ranges that overlap or lie close together.

    Two ranges are merged when the gap between them is at most ``max_gap``
    bytes: fetching a few unneeded bytes costs less than another request.

    Args:
        ranges: The ranges, in any order; empty ranges are dropped.
        max_gap: The largest gap, in bytes, that is read through. Default 0:
            only touching or overlapping ranges are merged.

    Returns:
        Sorted, disjoint ranges covering every input range, with gaps larger
        than ``max_gap`` between them.

    Raises:
        ConfigError: ``max_gap`` is negative (a ``ValueError``).
        ValueError: A range ends before it starts.
    """
    if max_gap < 0:
        raise ConfigError(f"merge_ranges: max_gap must be >= 0, got {max_gap}")
    ordered = sorted(ranges)
    merged: list[tuple[int, int]] = []
    for start, end in ordered:
        if end < start:
            raise ValueError(f"range end {end} is before start {start}")
        if end == start:
            continue
        if merged and start <= merged[-1][1] + max_gap:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged
