"""Which samples of an epoch one worker of one rank reads. Pure functions.

Shards are visited in the epoch's order (:func:`epoch_order`, seeded by
``(seed, epoch)``, the same on every rank). With every shard indexed, the
samples of that sequence are cut into contiguous spans: one per rank, then
one per DataLoader worker of the rank, so a worker reads at most two partial
shards and streams the rest whole; ``uneven`` follows the ``ShardingConfig``
rules on sample counts (``"drop"`` cuts the sequence to a multiple of the
world size, ``"pad"`` repeats its start). Without an index the sample counts
are unknown until read: whole shards are dealt out by :func:`shard_of`, and
``uneven`` applies to shard counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from torchbucket.datasets.sharding import IndexArray, epoch_order, shard_of

__all__ = ["Piece", "epoch_order", "worker_pieces"]

#: ``(shard, first sample, stop sample)``; stop ``-1``: to the shard's end.
Piece = tuple[int, int, int]


def _span(total: int, parts: int, part: int, equal: bool) -> tuple[int, int]:
    if equal:
        size = total // parts
        return part * size, (part + 1) * size
    return part * total // parts, (part + 1) * total // parts


def worker_pieces(
    order: IndexArray,
    counts: Sequence[int] | None,
    *,
    rank: int,
    world_size: int,
    worker: int = 0,
    num_workers: int = 1,
    uneven: Literal["keep", "drop", "pad"] = "keep",
) -> list[Piece]:
    """The pieces of shards one worker reads in an epoch, in order.

    Args:
        order: The epoch's order of shards.
        counts: Samples per shard (by shard number), or ``None`` when some
            shard has no index.
        rank: This rank, ``0 <= rank < world_size``.
        world_size: Number of ranks.
        worker: This DataLoader worker.
        num_workers: DataLoader workers per rank.
        uneven: ``"keep"``, ``"drop"`` or ``"pad"``.
    """
    if counts is None:
        mine = shard_of(
            order,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            uneven=uneven,
        )
        return [(int(s), 0, -1) for s in mine]
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is not in 0..{num_workers - 1}")
    sizes = np.asarray([counts[int(s)] for s in order], dtype=np.int64)
    total = int(sizes.sum())
    extra = total % world_size
    virtual = total
    if extra and uneven == "drop":
        virtual = total - extra
    elif extra and uneven == "pad" and total:
        virtual = total + world_size - extra
    r0, r1 = _span(virtual, world_size, rank, uneven != "keep")
    w0, w1 = _span(r1 - r0, num_workers, worker, False)
    start, stop = r0 + w0, r0 + w1
    bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    pieces: list[Piece] = []
    pos = start
    while pos < stop:
        p = pos % total if total else 0  # past the end: the padding repeats the start
        k = int(np.searchsorted(bounds, p, side="right")) - 1
        first = p - int(bounds[k])
        take = min(int(sizes[k]) - first, stop - pos)
        pieces.append((int(order[k]), first, first + take))
        pos += take
    return pieces
