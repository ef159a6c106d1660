"""The order of an epoch and its split over ranks and workers. Pure functions.

Not user API: the datasets and the shard datasets share it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["epoch_order", "shard_of"]

IndexArray = npt.NDArray[np.int64]

_MASK64 = (1 << 64) - 1


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> IndexArray:
    """The order in which an epoch visits indices ``0..n-1``.

    The same ``(seed, epoch)`` gives the same permutation in every process, so
    all ranks agree on it without talking to each other.

    Args:
        n: Number of objects.
        shuffle: Permute (seeded) or keep listing order.
        seed: Seed of the permutation.
        epoch: Epoch number; each epoch gets its own permutation.
    """
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed & _MASK64, epoch & _MASK64])
    return rng.permutation(n).astype(np.int64, copy=False)


def shard_of(
    order: IndexArray,
    *,
    rank: int,
    world_size: int,
    worker: int = 0,
    num_workers: int = 1,
    uneven: Literal["keep", "drop", "pad"] = "keep",
) -> IndexArray:
    """The part of an epoch's order that one worker of one rank reads.

    Ranks take interleaved positions (rank ``r`` takes ``r, r+W, ...``), then the
    rank's workers split its part the same way. With ``uneven="keep"`` the
    shards of all ranks and workers partition the order exactly; ``"drop"``
    first cuts the order to a multiple of ``world_size``, ``"pad"`` extends it
    by repeating its start, so every rank gets the same count.

    Args:
        order: The epoch's order (see :func:`epoch_order`).
        rank: This rank, ``0 <= rank < world_size``.
        world_size: Number of ranks.
        worker: This DataLoader worker, ``0 <= worker < num_workers``.
        num_workers: DataLoader workers per rank (1 without workers).
        uneven: ``"keep"``, ``"drop"`` or ``"pad"``.

    Returns:
        The indices this worker reads, in order (a view where possible).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is not in 0..{num_workers - 1}")
    extra = len(order) % world_size
    if extra and uneven == "drop":
        order = order[: len(order) - extra]
    elif extra and uneven == "pad" and len(order):
        order = np.concatenate([order, np.resize(order, world_size - extra)])
    return order[rank::world_size][worker::num_workers]
