"""The names ``gcs-torch-dataflux`` users know, on torchbucket.

Change the import and keep the code::

    # from dataflux_pytorch import dataflux_mapstyle_dataset
    from torchbucket import dataflux as dataflux_mapstyle_dataset

    dataset = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
        project_name="my-project",
        bucket_name="my-bucket",
        config=dataflux_mapstyle_dataset.Config(prefix="train/", max_composite_object_size=4 << 20),
        data_format_fn=decode,
    )

How each parameter maps:

======================== ===================================================
``project_name``         ``GCSConfig(project=...)``
``bucket_name``          the bucket of ``gs://bucket/prefix``
``config.prefix``        the prefix (``None``: the whole bucket)
``max_composite_object_size``, ``disable_compose``
                         ``ComposeConfig``; dataflux's 100 MB default is not
                         copied: unset means torchbucket's measured default
``download_retry_config``, ``list_retry_config``
                         a ``google.api_core`` ``Retry`` (its initial,
                         maximum, multiplier and deadline) or a
                         ``RetryConfig``; the download one wins when both
                         are given, as one store serves both
``data_format_fn``       the same
``sort_listing_results`` accepted; listings are always sorted
``num_processes``        accepted, ignored: listing runs on asyncio in one
                         process
``threads_per_process``  accepted, ignored: a batch is fetched with all its
                         requests in flight at once
``max_listing_retries``  accepted, ignored: the retry config governs listing
``storage_client``       accepted, ignored: requests go through aiohttp
======================== ===================================================

Differences on purpose: listing is sorted and de-duplicated; reads are pinned
to the listed generation (a rewritten object raises ``NotFoundError``); the
iterable dataset shards over DDP ranks as well as workers (dataflux gave every
rank every object); composites are deleted even when a worker dies of SIGTERM,
and ``torchbucket cleanup`` removes what a SIGKILL left.

Extension: ``bucket_name`` may also be a torchbucket URI such as
``memory://name`` or ``file:///dir`` (tests, laptops), and ``gcs_config``
passes a full :class:`~torchbucket.storage.gcs.GCSConfig` (an emulator
endpoint, concurrency).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset
from torchbucket.datasets._catalog import Catalog

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["Config", "DataFluxIterableDataset", "DataFluxMapStyleDataset", "data_format_default"]

logger = logging.getLogger(__name__)


def data_format_default(data: bytes) -> bytes:
    """The bytes unchanged (dataflux's default ``data_format_fn``)."""
    return data


class Config:
    """dataflux's ``Config``, with the same parameters and attributes.

    Keyword arguments are recommended: the positional order is that of the
    map-style ``Config`` (dataflux's iterable ``Config`` lacks
    ``threads_per_process``).

    Args:
        sort_listing_results: Accepted; listings are always sorted.
        max_composite_object_size: Cap on a composite in bytes; ``0`` turns
            compose off. Default ``None``: torchbucket's default (see
            :class:`~torchbucket.compose.ComposeConfig`).
        num_processes: Accepted, ignored.
        prefix: Only objects under this prefix. Default ``None``: all.
        max_listing_retries: Accepted, ignored.
        threads_per_process: Accepted, ignored.
        disable_compose: Turn compose off (sets the cap to 0, as dataflux does).
        list_retry_config: A ``google.api_core.retry.Retry`` or a
            :class:`~torchbucket.config.RetryConfig`.
        download_retry_config: Same; wins over ``list_retry_config``.
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
        self.sort_listing_results = sort_listing_results
        self.max_composite_object_size = 0 if disable_compose else max_composite_object_size
        self.num_processes = num_processes
        self.prefix = prefix
        self.max_listing_retries = max_listing_retries
        self.threads_per_process = threads_per_process
        self.disable_compose = disable_compose
        self.list_retry_config = list_retry_config
        self.download_retry_config = download_retry_config

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"Config({fields})"


def _retry(value: Any) -> RetryConfig | None:
    """A ``RetryConfig`` from ours or from a ``google.api_core`` ``Retry``."""
    if value is None or isinstance(value, RetryConfig):
        return value
    deadline = getattr(value, "_timeout", None) or getattr(value, "_deadline", None)
    return RetryConfig(
        initial_backoff=float(getattr(value, "_initial", 1.0)),
        max_backoff=float(getattr(value, "_maximum", 60.0)),
        multiplier=max(1.0, float(getattr(value, "_multiplier", 2.0))),
        deadline=float(deadline) if deadline else RetryConfig().deadline,
    )


def _ignored(config: Config, storage_client: Any) -> None:
    for name, default in (("num_processes", None), ("threads_per_process", 1)):
        if getattr(config, name) != default:
            logger.debug("dataflux Config.%s has no meaning in torchbucket; ignored", name)
    if storage_client is not None:
        logger.debug("dataflux storage_client is not used: torchbucket makes its own requests")


def _open(
    project_name: str | None,
    bucket_name: str,
    config: Config,
    storage_client: Any,
    gcs_config: GCSConfig | None,
) -> tuple[Catalog, ComposeConfig]:
    _ignored(config, storage_client)
    prefix = config.prefix or ""
    if "://" in bucket_name:
        uri = bucket_name.rstrip("/") + "/" + prefix
    else:
        uri = f"gs://{bucket_name}/{prefix}"
    resolved: GCSConfig | None = None
    if uri.startswith("gs://"):
        from torchbucket.storage.gcs import GCSConfig

        resolved = gcs_config or GCSConfig()
        retry = _retry(config.download_retry_config) or _retry(config.list_retry_config)
        changes: dict[str, Any] = {}
        if project_name and resolved.project is None:
            changes["project"] = project_name
        if retry is not None:
            changes["retry"] = retry
        resolved = dataclasses.replace(resolved, **changes)
    if config.max_composite_object_size is None:
        compose = ComposeConfig(disable=bool(config.disable_compose))
    else:
        compose = ComposeConfig(
            max_composite_object_size=int(config.max_composite_object_size),
            disable=bool(config.disable_compose),
        )
    return Catalog.from_prefix(uri, gcs_config=resolved), compose


def _adopt(
    dataset: Any,
    project_name: str | None,
    bucket_name: str,
    config: Config | None,
    data_format_fn: Callable[[bytes], Any],
    storage_client: Any,
    gcs_config: GCSConfig | None,
) -> tuple[Catalog, ComposeConfig]:
    """Keep dataflux's public attributes on ``dataset`` and list its objects."""
    dataset.project_name = project_name
    dataset.bucket_name = bucket_name
    dataset.config = config if config is not None else Config()
    dataset.data_format_fn = data_format_fn
    dataset.storage_client = None  # never pickled, never used
    return _open(project_name, bucket_name, dataset.config, storage_client, gcs_config)


class DataFluxMapStyleDataset(BucketMapDataset):
    """dataflux's map-style dataset, on :class:`~torchbucket.datasets.BucketMapDataset`.

    Args:
        project_name: The GCP project.
        bucket_name: The bucket (or, as an extension, a torchbucket URI).
        config: A :class:`Config`; default ``Config()``.
        data_format_fn: Bytes to sample; default: unchanged.
        storage_client: Accepted, ignored.
        gcs_config: Extension: how to reach GCS.

    Raises:
        NotFoundError: Nothing is under the prefix.
    """

    def __init__(
        self,
        project_name: str | None,
        bucket_name: str,
        config: Config | None = None,
        data_format_fn: Callable[[bytes], Any] = data_format_default,
        storage_client: Any = None,
        *,
        gcs_config: GCSConfig | None = None,
    ) -> None:
        catalog, compose = _adopt(
            self, project_name, bucket_name, config, data_format_fn, storage_client, gcs_config
        )
        super().__init__(catalog, data_format_fn=data_format_fn, compose=compose)

    @property
    def objects(self) -> list[tuple[str, int]]:
        """``(name, size)`` of each object, as dataflux lists them."""
        return [(self._catalog.name(i), int(self._catalog.sizes[i])) for i in range(len(self))]


class DataFluxIterableDataset(BucketIterableDataset):
    """dataflux's iterable dataset, on :class:`~torchbucket.datasets.BucketIterableDataset`.

    Objects are read in listing order, split over DataLoader workers and DDP
    ranks, each exactly once per epoch.

    Args:
        project_name: The GCP project.
        bucket_name: The bucket (or, as an extension, a torchbucket URI).
        config: A :class:`Config`; default ``Config()``.
        data_format_fn: Bytes to sample; default: unchanged.
        storage_client: Accepted, ignored.
        gcs_config: Extension: how to reach GCS.

    Raises:
        NotFoundError: Nothing is under the prefix.
    """

    def __init__(
        self,
        project_name: str | None,
        bucket_name: str,
        config: Config | None = None,
        data_format_fn: Callable[[bytes], Any] = data_format_default,
        storage_client: Any = None,
        *,
        gcs_config: GCSConfig | None = None,
    ) -> None:
        catalog, compose = _adopt(
            self, project_name, bucket_name, config, data_format_fn, storage_client, gcs_config
        )
        super().__init__(catalog, data_format_fn=data_format_fn, compose=compose)

    @property
    def objects(self) -> list[tuple[str, int]]:
        """``(name, size)`` of each object, as dataflux lists them."""
        return [
            (self._catalog.name(i), int(self._catalog.sizes[i])) for i in range(self.num_objects)
        ]
