"""``BucketBatchSampler``: seeded, DDP-aware, resumable batches whose order the dataset knows."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from torchbucket._checks import check_bool, check_instance, check_int
from torchbucket.datasets.config import ShardingConfig
from torchbucket.datasets.resumable import check_saved_state, dist_rank_world
from torchbucket.datasets.sharding import IndexArray, epoch_order, shard_of
from torchbucket.errors import ConfigError

__all__ = ["BatchPlan", "BucketBatchSampler"]

_STATE_VERSION = 1


class BatchPlan:
    """What a sampler shares with its dataset: how every epoch is cut into batches.

    Pickles into DataLoader workers with the dataset (spawn) or is inherited
    (fork). ``epoch_cell`` is shared memory holding the epoch the sampler's
    current iteration yields: the sampler writes it before handing out the
    iteration's first batch, so a worker that receives a batch finds it there.
    """

    def __init__(
        self,
        *,
        num_objects: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        rank: int,
        world_size: int,
        uneven: str,
    ) -> None:
        self.num_objects = num_objects
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.uneven = uneven
        self.epoch_cell = torch.zeros(1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    @property
    def current_epoch(self) -> int:
        """The epoch of the batches the sampler is handing out (or last handed out)."""
        return int(self.epoch_cell[0])

    def rank_order(self, epoch: int) -> IndexArray:
        """This rank's indices for ``epoch``, in the order its batches take them."""
        order = epoch_order(self.num_objects, shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        return shard_of(
            order,
            rank=self.rank,
            world_size=self.world_size,
            uneven=self.uneven,  # type: ignore[arg-type]
        )

    def num_batches(self, rank_len: int) -> int:
        """Batches in an epoch of ``rank_len`` indices (the last one may be short)."""
        if self.drop_last:
            return rank_len // self.batch_size
        return -(-rank_len // self.batch_size)

    def identity(self) -> dict[str, Any]:
        """What a state must match to resume in this plan."""
        return {
            "num_objects": self.num_objects,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "uneven": self.uneven,
        }


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of indices in a seeded order that the dataset reads ahead of.

    Pass it as the DataLoader's ``batch_sampler``; that is the whole fast path::

        loader = DataLoader(
            ds, batch_sampler=BucketBatchSampler(ds, batch_size=64, seed=17), num_workers=4
        )
        for epoch in range(10):
            loader.batch_sampler.set_epoch(epoch)
            for batch in loader:
                ...

    Made for a :class:`~torchbucket.datasets.BucketMapDataset`, it tells the
    dataset how every epoch is cut into batches. The DataLoader hands batches
    to its workers in turn (batch ``k`` to worker ``k % num_workers``), so
    each worker, from the first batch it is asked for, knows the next ones it
    will be asked for and keeps them in flight within the dataset's
    :class:`~torchbucket.datasets.FetchConfig` bounds, across batch
    boundaries, as the iterable dataset does. A batch that is not the one
    expected (``DataLoader(in_order=False)``, another sampler) is read on its
    own, as without this sampler: the fast path costs no correctness. The
    dataset follows the last sampler made for it. Any other sized dataset
    gets the batches, without read-ahead.

    The order: with ``shuffle``, each epoch is a permutation seeded by
    ``(seed, epoch)``, the same on every rank (the same one as
    :class:`~torchbucket.datasets.BucketIterableDataset` with that seed);
    call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``.
    Ranks take interleaved positions of it (rank ``r`` of ``W``: ``r, r+W,
    ...``; see :class:`~torchbucket.datasets.ShardingConfig` for uneven
    counts), then this rank's part is cut into batches of ``batch_size``.
    Every sample is in exactly one batch of one rank per epoch (with
    ``uneven="keep"`` and ``drop_last=False``).

    :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch without
    replaying or skipping a batch, directly or through
    ``torchdata.stateful_dataloader.StatefulDataLoader`` (with any number of
    DataLoader workers; a mid-epoch state needs the same ranks).

    Args:
        dataset: The dataset (its length is read once, here).
        batch_size: Indices per batch, >= 1.
        shuffle: Seeded random order per epoch; ``False``: index order.
            Default ``True``.
        seed: Seed of the order; must be the same on every rank. Default 0.
        drop_last: Leave out this rank's last batch when it is short.
            Default ``False``.
        sharding: Rank, world size and uneven counts; default
            ``ShardingConfig()`` (rank and world size from
            ``torch.distributed`` when initialised, read here, else one rank).

    Raises:
        ConfigError: An argument is not of its type or range.
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        sharding: ShardingConfig | None = None,
    ) -> None:
        owner = type(self).__name__
        check_instance(dataset, Sized, owner=owner, parameter="dataset", optional=False)
        check_int(batch_size, owner=owner, parameter="batch_size", minimum=1)
        check_int(seed, owner=owner, parameter="seed", minimum=-(2**63))
        check_bool(shuffle, owner=owner, parameter="shuffle")
        check_bool(drop_last, owner=owner, parameter="drop_last")
        check_instance(sharding, ShardingConfig, owner=owner, parameter="sharding")
        sharding = sharding if sharding is not None else ShardingConfig()
        if sharding.rank is not None and sharding.world_size is not None:
            rank, world = sharding.rank, sharding.world_size
        else:
            rank, world = dist_rank_world() or (0, 1)
        self.plan = BatchPlan(
            num_objects=len(dataset),
            batch_size=batch_size,
            shuffle=bool(shuffle),
            seed=seed,
            drop_last=bool(drop_last),
            rank=rank,
            world_size=world,
            uneven=sharding.uneven,
        )
        follow = getattr(dataset, "_follow", None)
        if follow is not None:
            follow(self.plan)
        self._epoch = 0
        self._pending: tuple[int, int] | None = None  # (epoch, batches done) to resume
        # The current (or last) iteration's [epoch, batches handed out]; None
        # once set_epoch moved to another epoch.
        self._current: list[int] | None = None
        self._len_cache: int | None = None

    @property
    def batch_size(self) -> int:
        """Indices per batch."""
        return self.plan.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether a short last batch is left out."""
        return self.plan.drop_last

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields."""
        return self._pending[0] if self._pending is not None else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration.

        Raises:
            ConfigError: ``epoch`` is negative.
        """
        check_int(epoch, owner=type(self).__name__, parameter="epoch", minimum=0)
        self._epoch = epoch
        if self._current is not None and self._current[0] != epoch:
            self._current = None
        if self._pending is not None and self._pending[0] != epoch:
            self._pending = None

    def _rank_len(self) -> int:
        if self._len_cache is None:
            # Shuffling does not change the split's sizes.
            plan = self.plan
            self._len_cache = len(
                shard_of(
                    np.arange(plan.num_objects, dtype=np.int64),
                    rank=plan.rank,
                    world_size=plan.world_size,
                    uneven=plan.uneven,  # type: ignore[arg-type]
                )
            )
        return self._len_cache

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.plan.num_batches(self._rank_len())

    def __iter__(self) -> Iterator[list[int]]:
        if self._pending is not None:
            epoch, start = self._pending
            self._pending = None
        else:
            epoch, start = self._epoch, 0
        # What state_dict reports from now on, until another iteration starts.
        current = [epoch, start]
        self._current = current
        return self._batches(current)

    def _batches(self, current: list[int]) -> Iterator[list[int]]:
        plan = self.plan
        epoch, start = current
        # Runs at the first next(), just before the DataLoader sends a batch out.
        plan.epoch_cell[0] = epoch
        order = plan.rank_order(epoch)
        size = plan.batch_size
        for k in range(start, plan.num_batches(len(order))):
            batch = order[k * size : (k + 1) * size].tolist()
            # Counted before it is handed out: a state taken once the
            # DataLoader holds this batch must not give it again.
            current[1] = k + 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Where the current (or last) iteration stands: epoch and batches handed out.

        Returns:
            A small dict of plain values. Through a ``StatefulDataLoader``,
            use the loader's ``state_dict()``: it takes this one when a batch
            is yielded.
        """
        if self._pending is not None:
            epoch, position = self._pending
        elif self._current is not None:
            epoch, position = self._current
        else:
            epoch, position = self._epoch, 0
        return {
            "version": _STATE_VERSION,
            **self.plan.identity(),
            "epoch": epoch,
            "position": position,
            "rank": self.plan.rank,
            "world_size": self.plan.world_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration resume where ``state`` was taken.

        Raises:
            ConfigError: The state is from another dataset or order, or is
                mid-epoch and from another rank or world size.
        """
        epoch, position = check_saved_state(
            state,
            version=_STATE_VERSION,
            identity=self.plan.identity(),
            what="BucketBatchSampler state",
            holder="sampler",
            batches=len(self),
        )
        layout = (state.get("rank"), state.get("world_size"))
        if 0 < position < len(self) and layout != (self.plan.rank, self.plan.world_size):
            raise ConfigError(
                f"a mid-epoch BucketBatchSampler state of rank {layout[0]} of {layout[1]} "
                f"cannot resume as rank {self.plan.rank} of {self.plan.world_size}"
            )
        self._pending = (epoch, position)
        self._current = None

    def __repr__(self) -> str:
        p = self.plan
        return (
            f"{type(self).__name__}(batch_size={p.batch_size}, shuffle={p.shuffle}, "
            f"seed={p.seed}, rank {p.rank} of {p.world_size}, {len(self)} batches)"
        )
