"""Read-ahead under a plain ``DataLoader``: the order torch's own sampler is about to yield.

``DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)`` builds a
``RandomSampler`` and a ``BatchSampler`` in the main process; each worker only
ever sees the batch it is asked for, so without more it fetches one batch at a
time (a round trip per batch, nothing in flight while the batch is collated
and handed over, and no compose: it would add its round trip to every batch).
With a :class:`~torchbucket.datasets.BucketBatchSampler` the dataset knows the
order and each worker reads ahead (:mod:`~torchbucket.datasets._readahead`).

This module gives a plain DataLoader the same. torch's samplers call
``len(dataset)`` as their ``__iter__`` starts, in the main process, before
they draw anything: ``RandomSampler`` (then a seed from torch's global
generator, or its own ``generator``), ``SequentialSampler`` and
``DistributedSampler`` (seeded by ``seed + epoch``). When
:meth:`ObservedOrder.observe` finds its caller to be one of those three
``__iter__`` methods driven by torch's ``BatchSampler``, it runs a second
iterator of the same sampler to its end with torch's generator states saved
and then restored, so the sampler's own iteration draws exactly what it would
have drawn, and publishes the order in shared memory that the DataLoader's
workers (forked or spawned after the dataset was sized) can read. A
worker's :class:`~torchbucket.datasets._readahead.ReadAhead` then serves a
batch from its window only if its indices are the ones expected; any other
batch is fetched on its own, as before. A sampler this does not know (a
subclass with its own ``__iter__``, but for Accelerate's ``SeedableRandomSampler``,
see :data:`_DELEGATING`; torchdata's stateful samplers; a custom one) gets
the batch-at-a-time path, unchanged.

Memory: the order, 4 bytes per object in shared memory, allocated when
``torch.utils.data`` first sizes the dataset (``RandomSampler`` and
``DistributedSampler`` do as they are built, before any worker starts);
``SequentialSampler``'s order is not stored. A dataset of more than
:data:`_MOST` objects is read ahead only with a ``BucketBatchSampler``.
The order is taken once per epoch in the main process: a second run of the
sampler, about as long as its own (a ``randperm`` of the dataset and a
Python list of it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    get_worker_info,
)

from torchbucket.datasets.sharding import IndexArray

__all__ = ["ObservedOrder"]

logger = logging.getLogger(__name__)

#: Datasets larger than this are not observed (the order would take more than
#: 16 MiB of shared memory, of which containers often have 64 MiB in all; a
#: BucketBatchSampler keeps no order in shared memory).
_MOST = 1 << 22

_SAMPLERS = {
    RandomSampler.__iter__.__code__: "random",
    SequentialSampler.__iter__.__code__: "sequential",
    DistributedSampler.__iter__.__code__: "distributed",
}
_BATCHES = BatchSampler.__iter__.__code__
# What the second run calls: torch's own ``__iter__``, whatever the class.
_ITERATE: dict[str, Callable[[Any], Iterator[int]]] = {
    "random": RandomSampler.__iter__,
    "sequential": SequentialSampler.__iter__,
    "distributed": DistributedSampler.__iter__,
}
#: Subclasses of torch's samplers whose own ``__iter__`` prepares the sampler
#: and then delegates to torch's (``yield from super().__iter__()``), found
#: past their frame. Hugging Face Accelerate's (the Trainer's default) seeds
#: its generator from its epoch first and moves the epoch on after: the second
#: run is torch's ``__iter__`` alone, from the state the subclass set, so
#: neither is repeated. (module, qualified name).
_DELEGATING = {("accelerate.data_loader", "SeedableRandomSampler")}

# Header cells: the version (bumped once per observed iteration), the order's
# length, the batch size, drop_last, and whether the order is 0..n-1 (not stored).
_VERSION, _LENGTH, _BATCH, _DROP, _SEQUENTIAL = range(5)

_busy = threading.local()


def _delegates(sampler: Any) -> bool:
    cls = type(sampler)
    return (cls.__module__, cls.__qualname__) in _DELEGATING


class ObservedOrder:
    """The order of the last iteration of a torch sampler over a dataset, shared with workers.

    Duck-types what :class:`~torchbucket.datasets._readahead.ReadAhead` reads of a
    :class:`~torchbucket.datasets._sampler.BatchPlan`: ``num_objects``,
    ``batch_size``, ``current_epoch``, ``rank_order`` and ``num_batches``.
    """

    def __init__(self, num_objects: int) -> None:
        self.num_objects = num_objects
        self._head = torch.zeros(5, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._order: torch.Tensor | None = None

    # What ReadAhead reads (in a worker, after a batch of the iteration arrived).

    @property
    def current_epoch(self) -> int:
        """The iteration observed last (0: none yet)."""
        return int(self._head[_VERSION])

    @property
    def batch_size(self) -> int:
        return int(self._head[_BATCH])

    def rank_order(self, epoch: int) -> IndexArray:
        """The indices the sampler yields in the iteration observed last, in order.

        Empty in a process that has no shared order (one started before it
        was allocated): no batch is found in it, each is fetched on its own.
        """
        del epoch  # the last observed; a batch of another one is not found in it
        length = int(self._head[_LENGTH])
        if int(self._head[_SEQUENTIAL]):
            return np.arange(length, dtype=np.int64)
        if self._order is None:
            return np.zeros(0, dtype=np.int64)
        return self._order[:length].numpy().astype(np.int64)

    def num_batches(self, rank_len: int) -> int:
        size = self.batch_size
        return rank_len // size if int(self._head[_DROP]) else -(-rank_len // size)

    # The main process.

    def observe(self, caller: FrameType | None) -> None:
        """Publish the order of the sampler iteration that is sizing the dataset, if it is torch's.

        Called from the dataset's ``__len__`` with its caller's frame, in the
        process that iterates the DataLoader. The first call from
        ``torch.utils.data`` (a sampler being built, before any worker
        starts) allocates the shared order. Never raises: an order it cannot
        take only leaves the workers without one.
        """
        if caller is None or getattr(_busy, "on", False) or get_worker_info() is not None:
            return
        if not str(caller.f_globals.get("__name__", "")).startswith("torch.utils.data"):
            return
        if self._order is None and 0 < self.num_objects <= _MOST:
            self._order = torch.zeros(self.num_objects, dtype=torch.int32).share_memory_()  # type: ignore[no-untyped-call]
        kind = _SAMPLERS.get(caller.f_code)
        if kind is None:
            return
        outer = caller.f_back
        sampler = caller.f_locals.get("self")
        if outer is not None and _delegates(sampler) and outer.f_locals.get("self") is sampler:
            outer = outer.f_back  # the subclass's own __iter__
        batches = outer.f_locals.get("self") if outer is not None else None
        if (
            outer is None
            or outer.f_code is not _BATCHES
            or not isinstance(batches, BatchSampler)
            or batches.sampler is not sampler
        ):
            return
        try:
            self._publish(kind, sampler, batches)
        except Exception:  # an order not taken costs read-ahead, never the epoch
            logger.debug("read-ahead: the sampler's order was not taken", exc_info=True)

    def _publish(self, kind: str, sampler: Any, batches: BatchSampler) -> None:
        """Share the order of this iteration, or that there is none (length 0).

        Either way the version moves on, so a worker drops what it read ahead
        in the order before; with no order, it reads batch at a time.
        """
        head = self._head
        n = self.num_objects
        length = 0
        try:
            if kind == "sequential":
                length = n
            elif self._order is not None and not (
                kind == "random" and (sampler.replacement or sampler.num_samples != n)
            ):
                order = self._run(kind, sampler)
                if len(order) <= n:
                    self._order[: len(order)] = torch.from_numpy(order.astype(np.int32))
                    length = len(order)
        finally:
            head[_LENGTH] = length
            head[_BATCH] = int(batches.batch_size)
            head[_DROP] = int(bool(batches.drop_last))
            head[_SEQUENTIAL] = int(kind == "sequential")
            head[_VERSION] += 1  # last: a worker that sees it finds the rest written
        logger.debug(
            "read-ahead: %s sampler's order of %d, batches of %d", kind, length, batches.batch_size
        )

    @staticmethod
    def _run(kind: str, sampler: Any) -> IndexArray:
        """A whole iteration of torch's ``__iter__`` on ``sampler``, the generators left as they were."""
        state = torch.random.get_rng_state()
        generator = getattr(sampler, "generator", None)
        if not isinstance(generator, torch.Generator):
            generator = None
        own = generator.get_state() if generator is not None else None
        _busy.on = True
        try:
            return np.fromiter(_ITERATE[kind](sampler), dtype=np.int64)
        finally:
            _busy.on = False
            torch.random.set_rng_state(state)
            if generator is not None and own is not None:
                generator.set_state(own)
