"""The resumable epochs of an iterable dataset: epoch, layout and state checks.

Not user API: ``BucketIterableDataset`` (objects) and ``BucketShardDataset``
(tar shards) share it. Both keep the epoch in shared memory (so ``set_epoch``
in the parent reaches persistent DataLoader workers), split an epoch over
``(rank, world size, worker, workers)``, and save a state dict that resumes
mid-epoch only with the same layout. What differs, the iterator and the fields
of its state, stays in each dataset.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch
from torch.utils.data import IterableDataset, get_worker_info

from torchbucket.datasets.config import ShardingConfig
from torchbucket.errors import ConfigError

__all__ = [
    "EpochIterator",
    "Layout",
    "ResumableEpochs",
    "check_resume_layout",
    "check_saved_state",
    "dist_rank_world",
]

Layout = tuple[int, int, int, int]  # rank, world size, worker, workers


def dist_rank_world() -> tuple[int, int] | None:
    """This process's ``(rank, world size)`` in ``torch.distributed``, if it is initialized."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def check_saved_state(
    state: Mapping[str, Any],
    *,
    version: int,
    identity: Mapping[str, Any],
    what: str = "state",
    holder: str = "dataset",
    batches: int | None = None,
) -> tuple[int, int]:
    """The ``(epoch, position)`` of a saved ``state``, if it was saved by the same order.

    The one check of every resumable thing here (the iterable datasets, the
    batch sampler): the state's version, then each key of ``identity`` (what
    decides the order of samples), then an epoch and position in range.

    Args:
        state: The saved state.
        version: The state version this code writes.
        identity: The keys and values the state must hold to resume here.
        what: How messages name the state (``"BucketBatchSampler state"``).
        holder: How messages name what resumes it (``"sampler"``).
        batches: Positions in an epoch, where known: a position past it is refused.

    Raises:
        ConfigError: Another version, another dataset or order (a key of
            ``identity`` differs), or an epoch or position out of range.
    """
    if state.get("version") != version:
        raise ConfigError(f"unknown {what} version {state.get('version')!r}")
    for key, mine in identity.items():
        if state.get(key) != mine:
            raise ConfigError(
                f"{what} is for {key}={state.get(key)!r}, this {holder} has {mine!r}: "
                "resuming would replay or skip samples"
            )
    epoch, position = int(state["epoch"]), int(state["position"])
    if epoch < 0 or position < 0 or (batches is not None and position > batches):
        limit = "" if batches is None else f"; an epoch here has {batches} batches"
        raise ConfigError(f"{what} has epoch {epoch} and position {position}{limit}")
    return epoch, position


def check_resume_layout(checked: Mapping[str, Any], layout: Layout) -> None:
    """Refuse a mid-epoch state taken with another layout than ``layout``.

    Args:
        checked: A state returned by ``ResumableEpochs._check_state``.
        layout: The layout of the iterator that would resume it.

    Raises:
        ConfigError: The state is mid-epoch and its layout is another.
    """
    saved = checked["layout"]
    if checked["position"] > 0 and saved is not None and tuple(saved) != layout:
        raise ConfigError(
            f"a mid-epoch state taken with (rank, world size, worker, workers) = "
            f"{tuple(saved)} cannot resume as {layout}: use the same number of "
            "ranks and DataLoader workers"
        )


class EpochIterator(Iterator[Any], Protocol):
    """What a resumable dataset asks of its iterators (one pass over one shard)."""

    epoch: int

    def close(self) -> None:
        """Stop reading ahead."""

    def state_dict(self) -> dict[str, Any]:
        """Where this iterator stands."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``."""


IteratorT = TypeVar("IteratorT", bound=EpochIterator)


class ResumableEpochs(IterableDataset[Any], Generic[IteratorT]):
    """An iterable dataset whose epochs are seeded, split by layout and resumable.

    A subclass calls ``super().__init__()`` in its constructor, sets
    ``_sharding``, names in ``_identity_keys`` the fields of its state that must
    match to resume, and implements ``_new_iterator`` and ``_fresh_state`` (the
    state at the start of the epoch, with ``version``, ``epoch``, ``position``
    and ``layout``). An ``__iter__`` of its own calls ``_start_iterator``; its
    public ``state_dict`` and ``load_state_dict`` call ``_current_state`` and
    ``_resume_next``.
    """

    _identity_keys: ClassVar[tuple[str, ...]]
    _sharding: ShardingConfig

    def __init__(self) -> None:
        # Shared memory: set_epoch in the parent reaches (persistent) workers.
        self._epoch_cell = torch.zeros(1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._dist = dist_rank_world()
        self._pending: dict[str, Any] | None = None
        # The last iterator, and whether it still is what state_dict reports
        # (until set_epoch moves to another epoch).
        self._last: IteratorT | None = None
        self._last_current = False

    @property
    def epoch(self) -> int:
        """The epoch the next iterator will read."""
        if self._pending is not None:
            return int(self._pending["epoch"])
        return int(self._epoch_cell[0])

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the shuffled order) of the next iterator.

        Raises:
            ConfigError: ``epoch`` is negative.
        """
        if int(epoch) < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch!r}")
        self._epoch_cell[0] = int(epoch)
        if self._last is not None and self._last.epoch != int(epoch):
            self._last_current = False
        if self._pending is not None and self._pending["epoch"] != int(epoch):
            self._pending = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Pickled in the parent when workers spawn: capture the rank there.
        state["_dist"] = dist_rank_world() or self._dist
        state["_last"] = None
        state["_last_current"] = False
        return state

    def _layout(self) -> Layout:
        if self._sharding.rank is not None and self._sharding.world_size is not None:
            rank, world = self._sharding.rank, self._sharding.world_size
        else:
            rank, world = dist_rank_world() or self._dist or (0, 1)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank, world, worker, workers

    @abstractmethod
    def _new_iterator(self, epoch: int, layout: Layout) -> IteratorT:
        """An iterator over ``layout``'s shard of ``epoch``, from its start."""

    @abstractmethod
    def _fresh_state(self) -> dict[str, Any]:
        """The state at the start of :attr:`epoch`, its layout ``None``."""

    def __iter__(self) -> Iterator[Any]:
        return self._start_iterator()

    def _start_iterator(self) -> IteratorT:
        """A new iterator of :attr:`epoch`, resuming the pending state if any."""
        if self._last is not None:
            self._last.close()
        iterator = self._new_iterator(self.epoch, self._layout())
        if self._pending is not None:
            # A resumed epoch stays local to this process: a worker restoring
            # its state never moves the epoch its parent set in shared memory.
            iterator.load_state_dict(self._pending)
            self._pending = None
        self._last = iterator
        self._last_current = True
        return iterator

    def _current_state(self) -> dict[str, Any]:
        """The pending state, else the current iterator's, else a fresh one."""
        if self._pending is not None:
            return dict(self._pending)
        if self._last is not None and self._last_current:
            return self._last.state_dict()
        return self._fresh_state()

    def _resume_next(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` and keep it for the next iterator (the last one closes)."""
        checked = self._check_state(state)
        if self._last is not None:
            self._last.close()
            self._last = None
        self._pending = checked

    def _checked_fields(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A subclass's own fields of ``state``, as plain values; by default none."""
        del state
        return {}

    def _check_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` as plain values, if this dataset can resume it.

        Raises:
            ConfigError: Another version, another dataset or order (one of
                ``_identity_keys`` differs), or a negative epoch or position.
        """
        mine = self._fresh_state()
        epoch, position = check_saved_state(
            state, version=mine["version"], identity={k: mine[k] for k in self._identity_keys}
        )
        layout = state.get("layout")
        return {
            **mine,
            "epoch": epoch,
            "position": position,
            **self._checked_fields(state),
            "layout": None if layout is None else [int(x) for x in layout],
        }
