"""Iterable dataset: a sharded, seeded, resumable stream with a prefetch window."""

from __future__ import annotations

import collections
import os
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from torchbucket import runtime
from torchbucket._checks import check_bool
from torchbucket.compose import ComposeConfig
from torchbucket.compose.registry import drain_deletes
from torchbucket.datasets._batch import Item
from torchbucket.datasets._common import (
    DataFormatFn,
    apply_format,
    check_dataset_arguments,
    prepare_compose,
    raise_item,
    read_compose_policies,
)
from torchbucket.datasets._fetch import PrefetchWindow
from torchbucket.datasets._handover import Reading
from torchbucket.datasets._shm import enable as reuse_shared_memory
from torchbucket.datasets._split import split_catalog, subset_catalog
from torchbucket.datasets._stats import EpochBoard
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.checks import check_source_arguments
from torchbucket.datasets.config import FetchConfig, ShardingConfig
from torchbucket.datasets.resumable import Layout, ResumableEpochs, check_resume_layout
from torchbucket.datasets.sharding import IndexArray, epoch_order, shard_of
from torchbucket.datasets.workers import settle_worker
from torchbucket.runtime.accounting import RequestStats

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketIterableDataset"]

_STATE_VERSION = 1
_FLUSH_S = 0.5  # how often a worker publishes its counts mid-epoch


class BucketIterableDataset(ResumableEpochs["_EpochIterator"]):
    """The objects under a prefix as a stream, sharded over ranks and workers.

    Build it with :meth:`from_prefix` or :meth:`from_objects`; the objects are
    listed once, in the constructor. Each iterator keeps a window of fetches in
    flight ahead of the consumer (:class:`FetchConfig`), across batch
    boundaries, which is what hides the store's latency.

    Every object is read exactly once per epoch over all ranks and DataLoader
    workers (see :class:`ShardingConfig` for uneven counts). With ``shuffle``,
    each epoch's order is a permutation seeded by ``(seed, epoch)``, the same on
    every rank; call :meth:`set_epoch` before each epoch, as with
    ``DistributedSampler``. The epoch is held in shared memory, so a call in the
    main process reaches persistent DataLoader workers too.

    :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch without
    replaying or skipping a sample, directly or through
    ``torchdata.stateful_dataloader.StatefulDataLoader`` (which snapshots each
    worker's iterator). A mid-epoch state resumes only with the same ranks and
    workers; a state from the start or the end of an epoch resumes with any.

    Reads are pinned to the listed generations: an object rewritten or deleted
    since listing raises ``NotFoundError`` when its turn comes.

    :attr:`last_epoch_stats` is what the last (or current) epoch asked of the
    store, summed over the DataLoader's workers (fork or spawn).

    Args:
        catalog: The objects (use the classmethods instead).
        data_format_fn: Turns an object's bytes (or, with
            ``FetchConfig(output="tensor")``, its ``uint8`` tensor) into a
            sample; default: them unchanged. Runs in the consuming thread (a
            DataLoader worker).
            An error it raises keeps its type and gains a note naming the
            object's URI.
        shuffle: Visit objects in a seeded random order. Default ``False``
            (listing order).
        seed: Seed of the order; must be the same on every rank. Default 0.
        sharding: Ranks and uneven counts; default ``ShardingConfig()``.
        fetch: Prefetch window, output (``bytes`` or a tensor handed over
            without a copy) and parallel ranged reads of large objects;
            default ``FetchConfig()``.
        compose: Small-object coalescing; default ``ComposeConfig()`` (on).
    """

    _identity_keys = ("num_objects", "shuffle", "seed", "uneven")

    def __init__(
        self,
        catalog: Catalog,
        *,
        data_format_fn: DataFormatFn | None = None,
        shuffle: bool = False,
        seed: int = 0,
        sharding: ShardingConfig | None = None,
        fetch: FetchConfig | None = None,
        compose: ComposeConfig | None = None,
    ) -> None:
        check_dataset_arguments(
            self,
            catalog,
            data_format_fn,
            compose,
            sharding=(sharding, ShardingConfig),
            fetch=(fetch, FetchConfig),
        )
        check_bool(shuffle, owner=type(self).__name__, parameter="shuffle")
        self._catalog = catalog
        self._format = data_format_fn
        self._shuffle = bool(shuffle)
        self._seed = int(seed)
        self._sharding = sharding if sharding is not None else ShardingConfig()
        self._fetch = fetch if fetch is not None else FetchConfig()
        # What this process reads with: the raw-bytes hand-over's config in a worker.
        self._reading = Reading(self._fetch, data_format_fn, catalog)
        self._compose = compose if compose is not None else ComposeConfig()
        read_compose_policies(catalog, self._compose)
        super().__init__()
        self._board = EpochBoard()

    @classmethod
    def from_prefix(
        cls,
        uri: str | os.PathLike[str],
        *,
        data_format_fn: DataFormatFn | None = None,
        gcs: GCSConfig | None = None,
        listing: ListingConfig | None = None,
        shuffle: bool = False,
        seed: int = 0,
        sharding: ShardingConfig | None = None,
        fetch: FetchConfig | None = None,
        compose: ComposeConfig | None = None,
    ) -> BucketIterableDataset:
        """Every object under a prefix; see the class for the options.

        Args:
            uri: ``gs://bucket/prefix``, ``memory://name/prefix`` or
                ``file:///dir/prefix``; a local path (``pathlib.Path`` or
                ``/data/train``) is read as ``file://`` (a directory: its files).
            data_format_fn: See the class.
            gcs: How to reach GCS, for ``gs://`` URIs. Default ``None``.
            listing: A ``torchbucket.listing.ListingConfig``. Default ``None``.
            shuffle: See the class.
            seed: See the class.
            sharding: See the class.
            fetch: See the class.
            compose: See the class.

        Raises:
            NotFoundError: Nothing is under the prefix.
        """
        check_source_arguments(
            f"{cls.__name__}.from_prefix",
            gcs,
            listing,
            compose=(compose, ComposeConfig),
            sharding=(sharding, ShardingConfig),
            fetch=(fetch, FetchConfig),
        )
        check_bool(shuffle, owner=f"{cls.__name__}.from_prefix", parameter="shuffle")
        catalog = Catalog.from_prefix(uri, gcs=gcs, listing=listing)
        return cls(
            catalog,
            data_format_fn=data_format_fn,
            shuffle=shuffle,
            seed=seed,
            sharding=sharding,
            fetch=fetch,
            compose=compose,
        )

    @classmethod
    def from_objects(
        cls,
        uris: Sequence[str | os.PathLike[str]],
        *,
        data_format_fn: DataFormatFn | None = None,
        gcs: GCSConfig | None = None,
        shuffle: bool = False,
        seed: int = 0,
        sharding: ShardingConfig | None = None,
        fetch: FetchConfig | None = None,
        compose: ComposeConfig | None = None,
    ) -> BucketIterableDataset:
        """The objects named by ``uris``, in that order; see :meth:`from_prefix`.

        Raises:
            NotFoundError: An object does not exist.
            ConfigError: ``uris`` is empty.
        """
        check_source_arguments(
            f"{cls.__name__}.from_objects",
            gcs,
            None,
            compose=(compose, ComposeConfig),
            sharding=(sharding, ShardingConfig),
            fetch=(fetch, FetchConfig),
        )
        check_bool(shuffle, owner=f"{cls.__name__}.from_objects", parameter="shuffle")
        catalog = Catalog.from_objects(uris, gcs=gcs)
        return cls(
            catalog,
            data_format_fn=data_format_fn,
            shuffle=shuffle,
            seed=seed,
            sharding=sharding,
            fetch=fetch,
            compose=compose,
        )

    def split(
        self, lengths: Sequence[int | float], *, generator: torch.Generator | None = None
    ) -> list[BucketIterableDataset]:
        """Random, non-overlapping parts (train and validation) of the same listing.

        The parts are the ones ``torch.utils.data.random_split`` would draw for
        a dataset of this length (torch's own function draws them), each a
        ``BucketIterableDataset`` with this one's ``data_format_fn``, order
        (``shuffle``, ``seed``) and configs::

            train, val = ds.split([0.9, 0.1], generator=torch.Generator().manual_seed(0))

        Args:
            lengths: Objects per part, adding up to ``num_objects``, or
                fractions adding up to 1.
            generator: Draws the parts; default torch's global generator.

        Raises:
            ConfigError: ``lengths`` do not add up, or leave a part empty.
        """
        catalogs = split_catalog(self._catalog, lengths, generator, f"{type(self).__name__}.split")
        return [self._part(catalog) for catalog in catalogs]

    def subset(self, indices: Sequence[int]) -> BucketIterableDataset:
        """The objects at ``indices`` of the listing, in that order, as a dataset of their own.

        Raises:
            ConfigError: ``indices`` is empty or not integers.
            IndexError: An index is out of range.
        """
        return self._part(subset_catalog(self._catalog, indices, f"{type(self).__name__}.subset"))

    def _part(self, catalog: Catalog) -> BucketIterableDataset:
        return BucketIterableDataset(
            catalog,
            data_format_fn=self._format,
            shuffle=self._shuffle,
            seed=self._seed,
            sharding=self._sharding,
            fetch=self._fetch,
            compose=self._compose,
        )

    @property
    def num_objects(self) -> int:
        """Objects in the dataset (over all ranks)."""
        return len(self._catalog)

    @property
    def last_epoch_stats(self) -> RequestStats:
        """The requests and bytes of the last (or current) epoch's reading.

        Summed over this process's DataLoader workers (each writes its counts
        to shared memory every half second and when its shard ends) or, without
        workers, this process's counts since the epoch's iterator began. Per
        rank: sum ranks with ``torchbucket.accounting.all_ranks``. Compose's
        bucket policy read, the composes and the composites' deletes are
        included; the listing (made by the constructor) is not.
        """
        return self._board.last()

    def _new_iterator(self, epoch: int, layout: Layout) -> _EpochIterator:
        return _EpochIterator(self, epoch, layout, 0)

    def __iter__(self) -> Iterator[Any]:
        iterator = self._start_iterator()
        prepare_compose(self._compose)
        settle_worker(self._fetch.freeze_gc)
        fetch = self._reading.config()
        if fetch.output == "tensor" and fetch.reuse_shared_memory:
            reuse_shared_memory()
        self._board.begin(iterator.epoch)
        return iterator

    def _fresh_state(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "position": 0,
            "layout": None,
            "num_objects": len(self._catalog),
            "shuffle": self._shuffle,
            "seed": self._seed,
            "uneven": self._sharding.uneven,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the current (or last) iterator of this process stands.

        Returns:
            A small dict of plain values: epoch, position in this worker's
            shard, the ranks x workers layout, and what identifies the order.
            In a process whose DataLoader has workers, the positions live in
            the workers: use ``StatefulDataLoader.state_dict()`` there.
        """
        return self._current_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iterator resume where ``state`` was taken.

        Raises:
            ConfigError: The state is from another dataset, order or layout.
        """
        self._resume_next(state)


class _EpochIterator(Iterator[Any]):
    """One pass over one worker's shard; the ``dataset_iter`` a DataLoader snapshots."""

    def __init__(
        self, dataset: BucketIterableDataset, epoch: int, layout: Layout, position: int
    ) -> None:
        self._dataset = dataset
        self.epoch = epoch
        self._layout = layout
        self._position = position
        self._order: IndexArray | None = None
        self._window: PrefetchWindow | None = None
        # Results taken from the window and not yet returned.
        self._ready: collections.deque[Item] = collections.deque()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._flush_at = 0.0

    def __iter__(self) -> _EpochIterator:
        return self

    def _shard(self) -> IndexArray:
        if self._order is None:
            ds = self._dataset
            rank, world, worker, workers = self._layout
            order = epoch_order(
                len(ds._catalog), shuffle=ds._shuffle, seed=ds._seed, epoch=self.epoch
            )
            self._order = shard_of(
                order,
                rank=rank,
                world_size=world,
                worker=worker,
                num_workers=workers,
                uneven=ds._sharding.uneven,
            )
        return self._order

    def __next__(self) -> Any:
        order = self._shard()
        pos = self._position
        if pos >= len(order):
            self.close()
            if self._dataset._compose.enabled:
                # The epoch leaves no composite behind.
                runtime.run(drain_deletes())
            self._dataset._board.flush()
            raise StopIteration
        if self._window is None:
            ds = self._dataset
            fetch = ds._reading.config()
            self._window = PrefetchWindow(ds._catalog, order, pos, fetch, ds._compose)
            self._finalizer = weakref.finalize(self, self._window.close)
            self._window.start()
        ready = self._ready
        if not ready:
            ready.extend(self._window.take(pos))
        item = ready.popleft()
        self._position = pos + 1
        ds = self._dataset
        now = time.monotonic()
        if now >= self._flush_at:
            self._flush_at = now + _FLUSH_S
            ds._board.flush()
        handing = ds._reading.handing()
        if ds._format is None and not isinstance(item, BaseException) and not handing:
            return item
        return apply_format(
            ds._format, raise_item(item), ds._catalog, int(order[pos]), handing=handing
        )

    def close(self) -> None:
        """Stop prefetching (called at the end, or when the iterator is dropped)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
            self._dataset._board.flush()
        self._window = None
        self._ready.clear()

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position of this iterator in its shard."""
        return {
            **self._dataset._fresh_state(),
            "epoch": self.epoch,
            "position": self._position,
            "layout": list(self._layout),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (restarts prefetching if it had begun).

        Raises:
            ConfigError: The state is from another dataset, order or layout.
        """
        checked = self._dataset._check_state(state)
        check_resume_layout(checked, self._layout)
        self.close()
        if checked["epoch"] != self.epoch:
            self.epoch = checked["epoch"]
            self._order = None
        self._position = checked["position"]
