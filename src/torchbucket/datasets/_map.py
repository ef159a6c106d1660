"""Map-style dataset: random access by index, a batch fetched concurrently."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset

from torchbucket import runtime
from torchbucket.compose import ComposeConfig, drain_deletes, read_verified
from torchbucket.datasets._catalog import Catalog
from torchbucket.datasets._common import (
    DataFormatFn,
    apply_format,
    check_dataset_arguments,
    check_source_arguments,
    prepare_compose,
    raise_item,
)
from torchbucket.datasets._fetch import fetch_batch

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketMapDataset"]

# Measured: see the class docstring.
_DEFAULT_COMPOSE = ComposeConfig(disable=True)


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

    Compose is off by default here, by measurement: it saves requests and
    client CPU, but adds a compose round trip to every batch, which a
    map-style dataset cannot hide (each worker fetches one batch at a time and
    cannot know the next one's indices). On the emulator's same-region model
    it cut the objects/s to about half (see
    :class:`~torchbucket.compose.ComposeConfig`).
    Pass ``compose=ComposeConfig()`` to trade throughput for fewer requests
    and less client CPU; for both, use :class:`BucketIterableDataset`, whose
    prefetch window hides the compose round trip.

    Args:
        catalog: The objects (use the classmethods instead).
        data_format_fn: Turns an object's bytes into a sample; default: the
            bytes unchanged. Runs in the process and thread that asked for the
            sample (a DataLoader worker), so it must pickle for spawn. An
            error it raises keeps its type and gains a note naming the
            object's URI (shown in the traceback, and in the message the
            DataLoader re-raises a worker's error with).
        compose: Small-object coalescing; default ``ComposeConfig(disable=True)``
            (off; see above).
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        data_format_fn: DataFormatFn | None = None,
        compose: ComposeConfig | None = None,
    ) -> None:
        check_dataset_arguments(self, catalog, data_format_fn, compose)
        self._catalog = catalog
        self._format = data_format_fn
        self._compose = compose if compose is not None else _DEFAULT_COMPOSE

    @classmethod
    def from_prefix(
        cls,
        uri: str,
        *,
        data_format_fn: DataFormatFn | None = None,
        gcs_config: GCSConfig | None = None,
        listing: ListingConfig | None = None,
        compose: ComposeConfig | None = None,
    ) -> BucketMapDataset:
        """Every object under a prefix, in name order.

        Args:
            uri: ``gs://bucket/prefix``, ``memory://name/prefix`` or
                ``file:///dir/prefix``.
            data_format_fn: See the class.
            gcs_config: How to reach GCS, for ``gs://`` URIs. Default ``None``.
            listing: A ``torchbucket.listing.ListingConfig``. Default ``None``.
            compose: See the class.

        Raises:
            NotFoundError: Nothing is under the prefix.
            InvalidURIError: The URI is malformed.
        """
        check_source_arguments(
            f"{cls.__name__}.from_prefix", gcs_config, listing, compose=(compose, ComposeConfig)
        )
        catalog = Catalog.from_prefix(uri, gcs_config=gcs_config, listing_config=listing)
        return cls(catalog, data_format_fn=data_format_fn, compose=compose)

    @classmethod
    def from_objects(
        cls,
        uris: Sequence[str],
        *,
        data_format_fn: DataFormatFn | None = None,
        gcs_config: GCSConfig | None = None,
        compose: ComposeConfig | None = None,
    ) -> BucketMapDataset:
        """The objects named by ``uris``, in that order (looked up concurrently).

        Raises:
            NotFoundError: An object does not exist.
            ConfigError: ``uris`` is empty.
        """
        check_source_arguments(
            f"{cls.__name__}.from_objects", gcs_config, None, compose=(compose, ComposeConfig)
        )
        catalog = Catalog.from_objects(uris, gcs_config=gcs_config)
        return cls(catalog, data_format_fn=data_format_fn, compose=compose)

    def __len__(self) -> int:
        return len(self._catalog)

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
        data = runtime.run(read_verified(store, self._catalog.info(i)))
        return apply_format(self._format, data, self._catalog, i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, fetched concurrently in one call.

        Raises:
            IndexError: An index is out of range.
            StorageError: Reading an object failed (the first failing index in
                the batch's order).
        """
        checked = [self._check(i) for i in indices]
        prepare_compose(self._compose)
        items = runtime.run(fetch_batch(self._catalog, checked, self._compose))
        try:
            # The batch's composites are being deleted meanwhile.
            return [
                apply_format(self._format, raise_item(item), self._catalog, i)
                for i, item in zip(checked, items, strict=True)
            ]
        finally:
            if self._compose.enabled:
                runtime.run(drain_deletes())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} objects)"
