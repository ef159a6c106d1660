"""``dataflux_pytorch.dataflux_iterable_dataset``, on :class:`~torchbucket.datasets.BucketIterableDataset`.

::

    # from dataflux_pytorch import dataflux_iterable_dataset
    from torchbucket.dataflux import dataflux_iterable_dataset

    dataset = dataflux_iterable_dataset.DataFluxIterableDataset(
        project_name="my-project",
        bucket_name="my-bucket",
        config=dataflux_iterable_dataset.Config(prefix="train/"),
    )
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from torchbucket._checks import check_instance
from torchbucket.dataflux._common import ConfigBase, ListedObjects, data_format_default
from torchbucket.datasets import BucketIterableDataset

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["Config", "DataFluxIterableDataset", "data_format_default"]


class Config(ConfigBase):
    """dataflux's iterable ``Config``: the same parameters, in the same order.

    It has no ``threads_per_process`` (the map-style one does), so its sixth
    positional parameter is ``disable_compose``.

    Args:
        sort_listing_results: Accepted; listings are always sorted.
        max_composite_object_size: Cap on a composite in bytes; ``0`` turns
            compose off. Default ``None``: torchbucket's default (on, with
            its measured cap; dataflux's is 100 MB).
        num_processes: Accepted, ignored: listing runs on asyncio in one process.
        prefix: Only objects under this prefix. Default ``None``: the bucket.
        max_listing_retries: Accepted, ignored: the retry policy governs listing.
        disable_compose: Turn compose off (the cap reads 0, as in dataflux).
        list_retry_config: A ``google.api_core`` ``Retry`` or a
            :class:`~torchbucket.config.RetryConfig`. Default: torchbucket's.
        download_retry_config: The same; wins over ``list_retry_config``.
    """

    def __init__(
        self,
        sort_listing_results: bool = False,
        max_composite_object_size: int | None = None,
        num_processes: int | None = None,
        prefix: str | None = None,
        max_listing_retries: int = 3,
        disable_compose: bool = False,
        list_retry_config: Any = None,
        download_retry_config: Any = None,
    ) -> None:
        self._set(
            sort_listing_results,
            max_composite_object_size,
            num_processes,
            prefix,
            max_listing_retries,
            1,
            disable_compose,
            list_retry_config,
            download_retry_config,
        )


class DataFluxIterableDataset(ListedObjects, BucketIterableDataset):
    """dataflux's iterable dataset: the objects as a stream, each once per epoch.

    Objects are read in listing order, split over DataLoader workers and, a
    deliberate difference, over DDP ranks too (dataflux gave every rank every
    object). ``objects`` is the list of ``(name, size)`` dataflux users index
    and assign. An empty prefix is an empty dataset.

    Args:
        project_name: The GCP project (kept as an attribute).
        bucket_name: The bucket (or, as an extension, a torchbucket URI).
        config: A :class:`Config`; default ``Config()``.
        data_format_fn: Bytes to sample; default: unchanged.
        storage_client: Accepted, ignored: requests go through aiohttp.
        gcs: Extension: how to reach GCS (endpoint, concurrency).

    Raises:
        ConfigError: An argument is not of its type.
    """

    def __init__(
        self,
        project_name: str | None,
        bucket_name: str,
        config: ConfigBase | None = None,
        data_format_fn: Callable[[bytes], Any] = data_format_default,
        storage_client: Any = None,
        *,
        gcs: GCSConfig | None = None,
    ) -> None:
        check_instance(config, ConfigBase, owner=type(self).__name__, parameter="config")
        config = config if config is not None else Config()
        catalog, compose = self._adopt(
            project_name, bucket_name, config, data_format_fn, storage_client, gcs
        )
        fn = None if data_format_fn is data_format_default else data_format_fn
        BucketIterableDataset.__init__(self, catalog, data_format_fn=fn, compose=compose)

    @property
    def num_objects(self) -> int:
        """Objects in the dataset (over all ranks)."""
        self._sync()
        return len(self._catalog)

    def __iter__(self) -> Iterator[Any]:
        self._sync()
        return super().__iter__()
