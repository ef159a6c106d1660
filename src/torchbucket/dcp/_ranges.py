"""Byte-range merging: :func:`torchbucket.storage.ranges.merge_ranges`, which shards use too."""

from __future__ import annotations

from torchbucket.storage.ranges import merge_ranges

__all__ = ["merge_ranges"]
