"""How an epoch's samples of shards are split over ranks x workers (property tests)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from torchbucket.shards._split import epoch_order, worker_pieces


def _samples(pieces: list[tuple[int, int, int]], counts: list[int]) -> list[tuple[int, int]]:
    out = []
    for shard, first, stop in pieces:
        stop = counts[shard] if stop < 0 else stop
        out.extend((shard, s) for s in range(first, stop))
    return out


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=12),
    world=st.integers(1, 5),
    workers=st.integers(1, 3),
    uneven=st.sampled_from(["keep", "drop", "pad"]),
    indexed=st.booleans(),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_every_sample_once_per_epoch_over_ranks_and_workers(
    counts: list[int],
    world: int,
    workers: int,
    uneven: str,
    indexed: bool,
    shuffle: bool,
    epoch: int,
) -> None:
    order = epoch_order(len(counts), shuffle=shuffle, seed=11, epoch=epoch)
    seen: Counter[tuple[int, int]] = Counter()
    per_rank = []
    for rank in range(world):
        n = 0
        for worker in range(workers):
            pieces = worker_pieces(
                order,
                counts if indexed else None,
                rank=rank,
                world_size=world,
                worker=worker,
                num_workers=workers,
                uneven=uneven,  # type: ignore[arg-type]
            )
            got = _samples(pieces, counts)
            seen.update(got)
            n += len(got)
        per_rank.append(n)
    every = {(s, i) for s, c in enumerate(counts) for i in range(c)}
    total = sum(counts)
    if (
        uneven == "keep"
        or (indexed and total % world == 0)
        or (not indexed and len(counts) % world == 0)
    ):
        assert set(seen) == every and set(seen.values()) <= {1}
    elif not indexed:
        return  # without indexes, uneven counts shards (the ShardingConfig rules on shards)
    elif uneven == "drop":
        assert set(seen.values()) == {1} or not seen
        assert len(seen) == total - total % world
        assert len(set(per_rank)) == 1
    else:  # pad: every sample at least once, each rank the same count
        assert set(seen) == every and max(seen.values()) <= 1 + (world - 1) // max(total, 1) + 1
        assert len(set(per_rank)) == 1 and sum(per_rank) == total + world - total % world
    if indexed and uneven == "keep":
        assert max(per_rank) - min(per_rank) <= 1
