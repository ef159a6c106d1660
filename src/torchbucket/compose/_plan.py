"""Group planning: which objects to compose together. A pure function."""

from __future__ import annotations

from collections.abc import Sequence

from torchbucket.errors import ConfigError
from torchbucket.storage.base import COMPOSE_MAX_SOURCES

__all__ = ["plan_groups"]


def plan_groups(
    sizes: Sequence[int],
    *,
    max_composite_object_size: int,
    max_sources: int = COMPOSE_MAX_SOURCES,
) -> list[range]:
    """Split a sequence of objects into consecutive groups to compose.

    Greedy and order-preserving: objects are taken in order into the current
    group while its total stays within ``max_composite_object_size`` and it has
    fewer than ``max_sources`` members. An object larger than the cap closes the
    current group and forms a group of its own. Groups of one are meant to be
    read directly, not composed.

    Args:
        sizes: Object sizes in bytes, in the order they will be consumed.
        max_composite_object_size: Cap on a group's total size; ``0`` or less
            makes every object a group of its own.
        max_sources: Cap on a group's number of members (>= 1).

    Returns:
        Consecutive ranges of positions into ``sizes`` whose concatenation is
        ``range(len(sizes))``.

    Raises:
        ConfigError: ``max_sources`` is below 1 (a ``ValueError``).
    """
    if max_sources < 1:
        raise ConfigError(f"plan_groups: max_sources must be >= 1, got {max_sources}")
    cap = max_composite_object_size
    groups: list[range] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        if cap <= 0 or size > cap:
            if start < i:
                groups.append(range(start, i))
            groups.append(range(i, i + 1))
            start, total = i + 1, 0
            continue
        if i - start >= max_sources or total + size > cap:
            groups.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups
