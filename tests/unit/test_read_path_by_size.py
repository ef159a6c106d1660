"""The read path a dataset picks by object size (issue 43): compose only below COMPOSE_BELOW."""

from __future__ import annotations

from torchbucket.compose import ComposeConfig
from torchbucket.datasets._units import COMPOSE_BELOW, plan_sizes


def test_objects_below_the_crossover_are_grouped() -> None:
    # Up to 32 sources, and up to the composite's size cap (4 MiB by default).
    units = plan_sizes([100 << 10] * 40, ComposeConfig())
    assert [len(u) for u in units] == [32, 8]
    cap = ComposeConfig().max_composite_object_size
    per = cap // (COMPOSE_BELOW - 1)
    units = plan_sizes([COMPOSE_BELOW - 1] * 40, ComposeConfig())
    assert [len(u) for u in units] == [per] * (40 // per) + ([40 % per] if 40 % per else [])
    assert per >= 2  # objects just below the cut are still grouped


def test_objects_from_the_crossover_on_are_read_directly() -> None:
    for size in (COMPOSE_BELOW, 512 << 10, 1 << 20):
        units = plan_sizes([size] * 10, ComposeConfig())
        assert [len(u) for u in units] == [1] * 10


def test_a_large_object_splits_the_small_ones_around_it() -> None:
    sizes = [100, 200, COMPOSE_BELOW, 300, 400]
    assert plan_sizes(sizes, ComposeConfig()) == [range(0, 2), range(2, 3), range(3, 5)]
