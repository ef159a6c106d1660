"""Epoch order and sharding: every index exactly once over any ranks x workers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from torchbucket.datasets.sharding import epoch_order, shard_of

layouts = st.tuples(
    st.integers(min_value=0, max_value=400),  # objects
    st.integers(min_value=1, max_value=7),  # ranks
    st.integers(min_value=1, max_value=5),  # workers per rank
    st.booleans(),  # shuffle
    st.integers(min_value=0, max_value=3),  # epoch
)


def _shards(n: int, world: int, workers: int, shuffle: bool, epoch: int, uneven: str):
    order = epoch_order(n, shuffle=shuffle, seed=1234, epoch=epoch)
    return order, {
        (r, w): shard_of(
            order, rank=r, world_size=world, worker=w, num_workers=workers, uneven=uneven
        ).tolist()
        for r in range(world)
        for w in range(workers)
    }


@given(layouts)
def test_keep_reads_every_object_exactly_once(layout: tuple[int, int, int, bool, int]) -> None:
    n, world, workers, shuffle, epoch = layout
    _, shards = _shards(n, world, workers, shuffle, epoch, "keep")
    everything = sorted(i for shard in shards.values() for i in shard)
    assert everything == list(range(n))
    per_rank = [sum(len(shards[r, w]) for w in range(workers)) for r in range(world)]
    assert max(per_rank) - min(per_rank) <= 1


@given(layouts)
def test_drop_gives_equal_ranks_without_duplicates(layout: tuple[int, int, int, bool, int]) -> None:
    n, world, workers, shuffle, epoch = layout
    _, shards = _shards(n, world, workers, shuffle, epoch, "drop")
    everything = [i for shard in shards.values() for i in shard]
    assert len(everything) == len(set(everything)) == n - n % world
    per_rank = {sum(len(shards[r, w]) for w in range(workers)) for r in range(world)}
    assert len(per_rank) == 1


@given(layouts)
def test_pad_gives_equal_ranks_covering_everything(layout: tuple[int, int, int, bool, int]) -> None:
    n, world, workers, shuffle, epoch = layout
    _, shards = _shards(n, world, workers, shuffle, epoch, "pad")
    everything = [i for shard in shards.values() for i in shard]
    assert set(everything) == set(range(n))
    assert len(everything) == (0 if n == 0 else -(-n // world) * world)
    per_rank = {sum(len(shards[r, w]) for w in range(workers)) for r in range(world)}
    assert len(per_rank) == 1


@given(st.integers(min_value=0, max_value=500), st.integers(min_value=0, max_value=2**40))
def test_epoch_order_is_a_seeded_permutation(n: int, seed: int) -> None:
    a = epoch_order(n, shuffle=True, seed=seed, epoch=3)
    assert sorted(a.tolist()) == list(range(n))
    assert np.array_equal(a, epoch_order(n, shuffle=True, seed=seed, epoch=3))


def test_order_changes_per_epoch_and_seed_and_not_without_shuffle() -> None:
    e0 = epoch_order(1000, shuffle=True, seed=5, epoch=0)
    assert not np.array_equal(e0, epoch_order(1000, shuffle=True, seed=5, epoch=1))
    assert not np.array_equal(e0, epoch_order(1000, shuffle=True, seed=6, epoch=0))
    assert epoch_order(5, shuffle=False, seed=5, epoch=7).tolist() == [0, 1, 2, 3, 4]
