"""``dataflux_pytorch.dataflux_mapstyle_dataset``, on :class:`~torchbucket.datasets.BucketMapDataset`.

::

    # from dataflux_pytorch import dataflux_mapstyle_dataset
    from torchbucket.dataflux import dataflux_mapstyle_dataset

    dataset = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
        project_name="my-project",
        bucket_name="my-bucket",
        config=dataflux_mapstyle_dataset.Config(prefix="train/"),
        data_format_fn=decode,
    )
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from torchbucket._checks import check_instance
from torchbucket.dataflux._common import ConfigBase, ListedObjects, data_format_default
from torchbucket.datasets import BucketMapDataset

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["Config", "DataFluxMapStyleDataset", "data_format_default"]


class Config(ConfigBase):
    """dataflux's map-style ``Config``: the same parameters, in the same order.

    Args:
        sort_listing_results: Accepted; listings are always sorted.
        max_composite_object_size: Cap on a composite in bytes; ``0`` turns
            compose off. Default ``None``: torchbucket's default, which for
            this dataset is compose on when it reads ahead (torch's own
            samplers in a plain ``DataLoader``, or a ``BucketBatchSampler``)
            and off batch at a time, where it cannot hide the compose round
            trip (measured; dataflux's default is 100 MB, on).
        num_processes: Accepted, ignored: listing runs on asyncio in one process.
        prefix: Only objects under this prefix. Default ``None``: the bucket.
        max_listing_retries: Accepted, ignored: the retry policy governs listing.
        threads_per_process: Accepted, ignored: a batch has all its requests
            in flight at once.
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
        threads_per_process: int = 1,
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
            threads_per_process,
            disable_compose,
            list_retry_config,
            download_retry_config,
        )


class DataFluxMapStyleDataset(ListedObjects, BucketMapDataset):
    """dataflux's map-style dataset: random access, a batch fetched concurrently.

    The prefix is listed in the constructor; ``objects`` is the list of
    ``(name, size)`` dataflux users index and assign (see
    :class:`~torchbucket.dataflux._common.ListedObjects`). An empty prefix is
    an empty dataset.

    Args:
        project_name: The GCP project (kept as an attribute; see the README's
            migration table for why it is not sent).
        bucket_name: The bucket (or, as an extension, a torchbucket URI such
            as ``memory://name`` or ``file:///dir``).
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
        BucketMapDataset.__init__(self, catalog, data_format_fn=fn, compose=compose)

    def __len__(self) -> int:
        self._sync()
        return super().__len__()

    def __getitem__(self, index: int) -> Any:
        self._sync()
        return super().__getitem__(index)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        self._sync()
        return super().__getitems__(indices)
