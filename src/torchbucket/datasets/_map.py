"""Map-style dataset: random access by index, a batch fetched concurrently."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, random_split

from torchbucket import runtime
from torchbucket.compose import ComposeConfig
from torchbucket.compose.registry import drain_deletes
from torchbucket.datasets._batch import Item, fetch_batch
from torchbucket.datasets._common import (
    DataFormatFn,
    apply_format,
    check_dataset_arguments,
    prepare_compose,
    raise_item,
    read_compose_policies,
)
from torchbucket.datasets._handover import Reading
from torchbucket.datasets._observed import ObservedOrder
from torchbucket.datasets._readahead import ReadAhead
from torchbucket.datasets._receive import read_object
from torchbucket.datasets._sampler import BatchPlan
from torchbucket.datasets._shm import enable as reuse_shared_memory
from torchbucket.datasets._split import split_catalog, subset_catalog
from torchbucket.datasets._stats import EpochBoard
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.checks import check_source_arguments
from torchbucket.datasets.config import FetchConfig
from torchbucket.datasets.workers import settle_worker
from torchbucket.runtime.accounting import RequestStats

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketMapDataset"]

# Measured: see the class docstring. Batch at a time, compose off; reading
# ahead with a BucketBatchSampler, compose on.
_DEFAULT_COMPOSE = ComposeConfig(enabled=False)
_DEFAULT_AHEAD_COMPOSE = ComposeConfig()

# torch's random_split sizes the dataset it cuts into Subsets (see split).
_RANDOM_SPLIT = random_split.__code__


class BucketMapDataset(Dataset[Any]):
    """The objects under a prefix (or a list of objects), by index.

    Build it with :meth:`from_prefix` or :meth:`from_objects`. The objects are
    listed once, in the constructor (so in the main process, before DataLoader
    workers start); the dataset is that snapshot. Reads are pinned to the
    listed generation: an object rewritten or deleted since raises
    ``NotFoundError``, never returns bytes the listing did not describe.

    With automatic batching the DataLoader calls :meth:`__getitems__`, which
    fetches the whole batch concurrently and, with compose on, coalesces its
    small objects. Any sampler works, ``DistributedSampler`` included. The
    dataset pickles as its listing and configuration, for spawned workers.

    Each DataLoader worker keeps the batches it will be asked for next in
    flight (requests across batch boundaries, and while a batch is collated
    and handed over), as :class:`BucketIterableDataset` does, when the
    dataset knows how the epoch is cut into batches: with torch's own
    samplers in a plain ``DataLoader(ds, batch_size=64, shuffle=True,
    num_workers=4)`` (``RandomSampler``, ``SequentialSampler`` or
    ``DistributedSampler``, or Accelerate's ``SeedableRandomSampler``, inside
    torch's ``BatchSampler``: the dataset takes
    the order the sampler is about to yield as it starts an epoch, leaving
    torch's random state as it was), or with a
    :class:`~torchbucket.datasets.BucketBatchSampler`, which is also
    resumable mid-epoch::

        loader = DataLoader(ds, batch_sampler=BucketBatchSampler(ds, batch_size=64),
                            num_workers=4)

    Memory: per worker (or in the main process without workers), what
    :class:`FetchConfig` bounds, ahead of what was handed over, in flight or
    arrived: at most
    ``fetch.prefetch_size`` (128 MiB), and ``4 x fetch.reads_in_flight`` objects
    reading directly (512: 51 MiB of 100 KiB objects) or, composing, up to
    four times the objects of the groups in flight (7,936: 78 MiB of 10 KiB
    objects; of 100 KiB objects, what 128 MiB holds); plus a
    hand-over chunk of up to 32 objects. With any
    other sampler (or over 4,194,304 objects without a ``BucketBatchSampler``),
    through a ``torch.utils.data.Subset`` (``random_split``'s parts: use
    :meth:`split`), or a batch out of the expected turn, a batch is fetched
    when asked for.

    Compose by default, by measurement (``benchmarks/dataloading.py
    --quick``, the emulator's same-region model, 2 workers, batch 64; see
    :class:`~torchbucket.compose.ComposeConfig`): on when reading ahead,
    where the window hides the compose round trip
    as in the iterable dataset (objects/s 1.9-2.0x at 10 KiB and 1.3-1.6x at
    100 KiB over direct reads, with fewer requests and less client CPU); off batch
    at a time, where each batch would wait for its compose (objects/s cut to
    about a third). An explicit ``compose`` applies to both.

    Args:
        catalog: The objects (use the classmethods instead).
        data_format_fn: Turns an object's bytes (or, with
            ``FetchConfig(output="tensor")``, its ``uint8`` tensor) into a
            sample; default: them unchanged. Runs in the process and thread
            that asked for the sample (a DataLoader worker), so it must
            pickle for spawn. An
            error it raises keeps its type and gains a note naming the
            object's URI (shown in the traceback, and in the message the
            DataLoader re-raises a worker's error with).
        compose: Small-object coalescing; default ``ComposeConfig()`` when
            reading ahead, ``ComposeConfig(enabled=False)`` batch at a time
            (see above).
        fetch: Bounds of the read-ahead, the
            output (``bytes`` or a tensor handed over without a copy) and
            parallel ranged reads of large objects; default ``FetchConfig()``
            (128 requests in flight, 128 MiB, bytes, ranges from 8 MiB).
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        data_format_fn: DataFormatFn | None = None,
        compose: ComposeConfig | None = None,
        fetch: FetchConfig | None = None,
    ) -> None:
        check_dataset_arguments(self, catalog, data_format_fn, compose, fetch=(fetch, FetchConfig))
        self._catalog = catalog
        self._format = data_format_fn
        self._compose = compose if compose is not None else _DEFAULT_COMPOSE
        self._ahead_compose = compose if compose is not None else _DEFAULT_AHEAD_COMPOSE
        self._fetch = fetch if fetch is not None else FetchConfig()
        # What this process reads with: the raw-bytes hand-over's config in a worker.
        self._reading = Reading(self._fetch, data_format_fn, catalog)
        read_compose_policies(catalog, self._compose, self._ahead_compose)
        # The order of the last BucketBatchSampler made for this dataset, and
        # this process's read-ahead over it (never pickled or inherited).
        self._plan: BatchPlan | None = None
        # Without one, the order of torch's own sampler, taken as it starts an
        # epoch (a plain DataLoader(shuffle=True) reads ahead too: _observed.py).
        self._observed = ObservedOrder(len(catalog))
        self._reader: ReadAhead | None = None
        self._reader_pid = 0
        self._board = EpochBoard()

    @classmethod
    def from_prefix(
        cls,
        uri: str | os.PathLike[str],
        *,
        data_format_fn: DataFormatFn | None = None,
        gcs: GCSConfig | None = None,
        listing: ListingConfig | None = None,
        compose: ComposeConfig | None = None,
        fetch: FetchConfig | None = None,
    ) -> BucketMapDataset:
        """Every object under a prefix, in name order.

        Args:
            uri: ``gs://bucket/prefix``, ``memory://name/prefix`` or
                ``file:///dir/prefix``; a local path (``pathlib.Path`` or
                ``/data/train``) is read as ``file://`` (a directory: its files).
            data_format_fn: See the class.
            gcs: How to reach GCS, for ``gs://`` URIs. Default ``None``.
            listing: A ``torchbucket.listing.ListingConfig``. Default ``None``.
            compose: See the class.
            fetch: See the class.

        Raises:
            NotFoundError: Nothing is under the prefix.
            InvalidURIError: The URI is malformed.
        """
        check_source_arguments(
            f"{cls.__name__}.from_prefix",
            gcs,
            listing,
            compose=(compose, ComposeConfig),
            fetch=(fetch, FetchConfig),
        )
        catalog = Catalog.from_prefix(uri, gcs=gcs, listing=listing)
        return cls(catalog, data_format_fn=data_format_fn, compose=compose, fetch=fetch)

    @classmethod
    def from_objects(
        cls,
        uris: Sequence[str | os.PathLike[str]],
        *,
        data_format_fn: DataFormatFn | None = None,
        gcs: GCSConfig | None = None,
        compose: ComposeConfig | None = None,
        fetch: FetchConfig | None = None,
    ) -> BucketMapDataset:
        """The objects named by ``uris``, in that order (looked up concurrently).

        Raises:
            NotFoundError: An object does not exist.
            ConfigError: ``uris`` is empty.
        """
        check_source_arguments(
            f"{cls.__name__}.from_objects",
            gcs,
            None,
            compose=(compose, ComposeConfig),
            fetch=(fetch, FetchConfig),
        )
        catalog = Catalog.from_objects(uris, gcs=gcs)
        return cls(catalog, data_format_fn=data_format_fn, compose=compose, fetch=fetch)

    def split(
        self, lengths: Sequence[int | float], *, generator: torch.Generator | None = None
    ) -> list[BucketMapDataset]:
        """Random, non-overlapping parts (train and validation), each a dataset that reads ahead.

        The parts are the ones ``torch.utils.data.random_split(ds, lengths,
        generator)`` would make (torch's own function draws them), but each
        is a ``BucketMapDataset`` over part of the same listing, with this
        one's ``data_format_fn`` and configs: a plain ``DataLoader(part,
        shuffle=True)`` reads ahead over it. ``random_split``'s ``Subset``
        hides torch's sampler from the dataset, and a DataLoader over it
        reads one batch at a time::

            train, val = ds.split([0.9, 0.1], generator=torch.Generator().manual_seed(0))

        Args:
            lengths: Objects per part, adding up to ``len(ds)``, or fractions
                adding up to 1 (the remainders as ``random_split`` places them).
            generator: Draws the parts; default torch's global generator, as
                ``random_split``.

        Raises:
            ConfigError: ``lengths`` do not add up, or leave a part empty.
        """
        catalogs = split_catalog(self._catalog, lengths, generator, f"{type(self).__name__}.split")
        return [self._part(catalog) for catalog in catalogs]

    def subset(self, indices: Sequence[int]) -> BucketMapDataset:
        """The objects at ``indices``, in that order, as a dataset that reads ahead (see :meth:`split`).

        Raises:
            ConfigError: ``indices`` is empty or not integers.
            IndexError: An index is out of range.
        """
        return self._part(subset_catalog(self._catalog, indices, f"{type(self).__name__}.subset"))

    def _part(self, catalog: Catalog) -> BucketMapDataset:
        defaults = (
            self._compose is _DEFAULT_COMPOSE and self._ahead_compose is _DEFAULT_AHEAD_COMPOSE
        )
        return BucketMapDataset(
            catalog,
            data_format_fn=self._format,
            compose=None if defaults else self._compose,
            fetch=self._fetch,
        )

    def __len__(self) -> int:
        n = len(self._catalog)
        if self._plan is None:
            if self._observed.num_objects != n:  # another catalog (dataflux's ``objects``)
                self._observed = ObservedOrder(n)
            # torch's samplers size the dataset as they are built (before the
            # DataLoader's workers start) and as each iteration begins; the
            # caller is the first frame past a subclass's own ``__len__``.
            caller = sys._getframe(1)
            depth = 2
            while caller.f_code.co_name == "__len__" and caller.f_locals.get("self") is self:
                if caller.f_back is None:
                    break
                caller = caller.f_back
                depth += 1
            if caller.f_code is _RANDOM_SPLIT:
                warnings.warn(
                    f"random_split makes torch Subsets of {type(self).__name__}, which a "
                    "DataLoader reads one batch at a time (no read-ahead, no compose); "
                    "ds.split(lengths, generator=...) makes the same parts as datasets "
                    "that read ahead",
                    stacklevel=depth + 1,
                )
            self._observed.observe(caller)
        return n

    def uri(self, index: int) -> str:
        """The URI of the object at ``index``."""
        return self._catalog.uri(self._check(index))

    def _check(self, index: int) -> int:
        n = len(self._catalog)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} objects")
        return i

    def __getitem__(self, index: int) -> Any:
        """The sample at ``index`` (one request).

        Raises:
            IndexError: ``index`` is out of range.
            NotFoundError: The object is gone or was rewritten since listing.
        """
        i = self._check(index)
        store = self._catalog.store(i)
        self._count_begin()
        try:
            fetch = self._reading.config()
            data = runtime.run(read_object(store, self._catalog.info(i), fetch))
        finally:
            self._board.flush()
        return apply_format(self._format, data, self._catalog, i, handing=self._reading.handing())

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, fetched concurrently in one call.

        Raises:
            IndexError: An index is out of range.
            StorageError: Reading an object failed (the first failing index in
                the batch's order).
        """
        checked = [self._check(i) for i in indices]
        prepare_compose(self._compose)
        self._count_begin()
        ahead = self._read_ahead(checked)
        items = ahead if ahead is not None else self._fetch_now(checked)
        handing = self._reading.handing()
        try:
            # The batch's composites are being deleted meanwhile.
            return [
                apply_format(self._format, raise_item(item), self._catalog, i, handing=handing)
                for i, item in zip(checked, items, strict=True)
            ]
        finally:
            if ahead is None and self._compose.enabled:
                runtime.run(drain_deletes())
            self._board.flush()

    @property
    def last_epoch_stats(self) -> RequestStats:
        """The requests and bytes of the last (or current) epoch's reads.

        Summed over the DataLoader's workers (fork or spawn; each writes its
        counts to shared memory after every batch). An epoch here begins in
        each new worker process, so with the default non-persistent workers
        one DataLoader pass is one epoch; with persistent workers, or without
        workers, counting goes on until :meth:`reset_epoch_stats`. Per rank:
        sum ranks with ``torchbucket.accounting.all_ranks``. The listing (made
        by the constructor) is not included.
        """
        return self._board.last()

    def reset_epoch_stats(self) -> None:
        """Start a new epoch of :attr:`last_epoch_stats`: every process's next read counts from zero."""
        self._board.new_mark()

    def _count_begin(self) -> None:
        settle_worker(self._fetch.freeze_gc)
        fetch = self._reading.config()
        if fetch.output == "tensor" and fetch.reuse_shared_memory:
            reuse_shared_memory()
        board = self._board
        mark = board.mark
        if not board.begun(mark):
            board.begin(mark)

    def _fetch_now(self, indices: list[int]) -> list[Item]:
        fetch = self._reading.config()
        return runtime.run(fetch_batch(self._catalog, indices, self._compose, fetch))

    def _read_ahead(self, indices: list[int]) -> list[Item] | None:
        """The batch from this process's read-ahead, or ``None`` (not the plan's order)."""
        plan: BatchPlan | ObservedOrder | None = self._plan
        if plan is None and self._observed.current_epoch:
            plan = self._observed
        if plan is None:
            return None
        reader = self._reader
        pid = os.getpid()
        if (
            reader is None
            or self._reader_pid != pid
            or reader.catalog is not self._catalog
            or reader.plan is not plan
        ):
            if reader is not None and self._reader_pid == pid:
                reader.close()
            prepare_compose(self._ahead_compose)
            fetch = self._reading.config()
            reader = ReadAhead(self._catalog, plan, fetch, self._ahead_compose)
            self._reader, self._reader_pid = reader, pid
        return reader.get(indices)

    def _follow(self, plan: BatchPlan) -> None:
        """Read ahead in ``plan``'s order (called by ``BucketBatchSampler``)."""
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
        self._plan = plan
        self._reader = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_reader_pid"] = 0
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} objects)"
