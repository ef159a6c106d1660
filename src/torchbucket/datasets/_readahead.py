"""A map-style dataset's read-ahead: the batches one process will be asked for, in flight.

The DataLoader hands batches to its workers in turn (batch ``k`` to worker
``k % num_workers``, ``prefetch_factor`` of them queued per worker). With a
:class:`~torchbucket.datasets.BucketBatchSampler` (or torch's own sampler,
observed as it starts an epoch: :mod:`~torchbucket.datasets._observed`), the
dataset knows how the epoch is cut into batches; from the first batch a worker is asked for (found
by its indices in the epoch's order) it knows the rest of its own: ``b,
b + W, b + 2W, ...``. :class:`ReadAhead` keeps those in one
:class:`~torchbucket.datasets._fetch.PrefetchWindow`, the iterable dataset's,
so requests stay in flight across batch boundaries and while a batch is
collated and handed over.

Every batch served is checked: it is served from the window only when its
indices are the ones expected next; otherwise the window follows it (a
resumed or restarted iteration starts elsewhere), or, for a batch that is not
in the plan's order, the caller reads it on its own. A batch further on than
the one expected, after one served from the window, sets the step between
the worker's batches: a batch sampler that hands this process every ``P``-th
batch of torch's (Hugging Face Accelerate's ``BatchSamplerShard`` across ``P``
processes) gives each worker every ``P x W``-th. A process that keeps
being asked for batches out of turn (``DataLoader(in_order=False)``) stops
reading ahead for the rest of the epoch.
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import get_worker_info

from torchbucket import runtime
from torchbucket.compose import ComposeConfig
from torchbucket.compose.registry import drain_deletes
from torchbucket.datasets._batch import Item
from torchbucket.datasets._fetch import PrefetchWindow
from torchbucket.datasets._observed import ObservedOrder
from torchbucket.datasets._sampler import BatchPlan
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig
from torchbucket.datasets.sharding import IndexArray

__all__ = ["ReadAhead"]

logger = logging.getLogger(__name__)

# Windows restarted in one epoch (a batch other than the one expected, but in
# the plan) before this process stops reading ahead until the next epoch.
_MAX_RESYNCS = 4

_warned = False


class ReadAhead:
    """One process's read-ahead over the batches of a :class:`BatchPlan`.

    Args:
        catalog: The dataset's objects.
        plan: How epochs are cut into batches (from the sampler, or observed).
        fetch: The window's bounds: requests in flight and bytes held ahead.
        compose: Small-object coalescing in the window.
    """

    def __init__(
        self,
        catalog: Catalog,
        plan: BatchPlan | ObservedOrder,
        fetch: FetchConfig,
        compose: ComposeConfig,
    ) -> None:
        self.catalog = catalog
        self.plan = plan
        self._fetch = fetch
        self._compose = compose
        self._usable = plan.num_objects == len(catalog)
        self._epoch = -1
        self._order: IndexArray = np.zeros(0, dtype=np.int64)
        self._where: npt.NDArray[np.integer[Any]] = np.zeros(0, dtype=np.int32)
        self._count = 0
        self._resyncs = 0
        self._off = False
        self._window: PrefetchWindow | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._batches: list[int] = []  # the window's batches, in order
        # Plan batches from one of this worker's batches to its next: the
        # DataLoader's workers (W), or as learned (see the module); kept
        # across epochs (persistent workers: the same DataLoader).
        self._step = 0
        self._next = 0  # index in _batches of the batch expected next
        self._pos = 0  # window position of that batch's first object
        self._ready: collections.deque[Item] = collections.deque()

    def get(self, indices: Sequence[int]) -> list[Item] | None:
        """The items of the batch ``indices``, or ``None``: read it on its own.

        Raises:
            BaseException: The window's fetchers failed (not an object's read
                error: those are items).
        """
        if not self._usable or not indices:
            return None
        if self._window is not None and self._is_next(indices):
            return self._take(len(indices))
        return self._follow(indices)

    def close(self) -> None:
        """Stop the window's fetches (composites in flight are still deleted)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._window = None
        self._ready.clear()

    def _is_next(self, indices: Sequence[int]) -> bool:
        if self._next >= len(self._batches):
            return False
        b = self._batches[self._next]
        size = self.plan.batch_size
        expected = self._order[b * size : (b + 1) * size]
        return len(expected) == len(indices) and bool(np.array_equal(expected, indices))

    def _load_epoch(self, epoch: int) -> None:
        self.close()
        self._epoch = epoch
        self._order = self.plan.rank_order(epoch)
        # Position of each index in this rank's order (-1: another rank's);
        # written backwards so an index padded in twice maps to its first place.
        # int32 where it fits: 4 bytes per object of the dataset, per process.
        dtype = np.int32 if len(self._order) < 2**31 else np.int64
        # No order (an observed sampler's not taken): nothing is found in it.
        where = np.full(self.plan.num_objects if len(self._order) else 0, -1, dtype=dtype)
        where[self._order[::-1]] = np.arange(len(self._order) - 1, -1, -1, dtype=dtype)
        self._where = where
        self._count = self.plan.num_batches(len(self._order))
        self._resyncs = 0
        self._off = False

    def _find(self, indices: Sequence[int]) -> int | None:
        size = self.plan.batch_size
        first = int(indices[0])
        if not 0 <= first < len(self._where):
            return None
        p = int(self._where[first])
        if p < 0 or p % size:
            return None
        b = p // size
        expected = self._order[p : p + size]
        if b >= self._count or not np.array_equal(expected, indices):
            return None
        return b

    def _follow(self, indices: Sequence[int]) -> list[Item] | None:
        epoch = self.plan.current_epoch
        if epoch != self._epoch:
            self._load_epoch(epoch)
        b = None if self._off else self._find(indices)
        if b is None:
            # Not a batch of the plan's current epoch: leave the window be
            # (the batches it holds may still be asked for).
            logger.debug("read-ahead: a batch outside epoch %d's order, read on its own", epoch)
            return None
        if self._window is not None:
            self._resyncs += 1
            if self._resyncs > _MAX_RESYNCS:
                self._stop_for_epoch()
                return None
            if self._next > 0 and b > self._batches[self._next - 1]:
                self._step = b - self._batches[self._next - 1]
        self._start(b)
        logger.debug(
            "read-ahead: epoch %d from batch %d, %d batches of %d, every %d",
            epoch,
            b,
            len(self._batches),
            self._count,
            self._batches[1] - b if len(self._batches) > 1 else 0,
        )
        return self._take(len(indices))

    def _stop_for_epoch(self) -> None:
        global _warned
        self.close()
        self._off = True
        if not _warned:
            _warned = True
            logger.warning(
                "torchbucket: batches of %s arrive out of the order the DataLoader "
                "usually hands them to workers in (in_order=False?); this process reads "
                "them one batch at a time until the next epoch",
                self.catalog.uri(0),
            )

    def _start(self, first_batch: int) -> None:
        self.close()
        info = get_worker_info()
        step = self._step or (info.num_workers if info is not None else 1)
        size = self.plan.batch_size
        self._batches = list(range(first_batch, self._count, step))
        order = self._order
        shard = np.concatenate([order[b * size : (b + 1) * size] for b in self._batches])
        window = PrefetchWindow(self.catalog, shard, 0, self._fetch, self._compose)
        self._finalizer = weakref.finalize(self, window.close)
        window.start()
        self._window = window
        self._next = 0
        self._pos = 0

    def _take(self, n: int) -> list[Item]:
        window = self._window
        assert window is not None
        ready = self._ready
        try:
            while len(ready) < n:
                # Wake for this batch's own last objects, not a whole chunk
                # (which would wait for the next batch's first ones too).
                ready.extend(window.take(self._pos + len(ready), n - len(ready)))
        except BaseException:
            self.close()
            raise
        out = [ready.popleft() for _ in range(n)]
        self._pos += n
        self._next += 1
        if self._next >= len(self._batches):
            self.close()
            if self._compose.enabled:
                # This process's part of the epoch leaves no composite behind.
                runtime.run(drain_deletes())
        return out
