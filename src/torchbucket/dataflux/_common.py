"""What the dataflux-named modules share: arguments, URIs, configs, the ``objects`` list."""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, SupportsIndex

from torchbucket._checks import check_callable, check_instance
from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.storage.checks import check_gcs_config

if TYPE_CHECKING:
    from torchbucket.datasets.catalog import Catalog
    from torchbucket.storage.gcs import GCSConfig

__all__ = [
    "ConfigBase",
    "ListedObjects",
    "ObjectList",
    "bucket_uri",
    "check_names",
    "data_format_default",
    "gcs_config_for",
    "retry_config",
]

logger = logging.getLogger(__name__)


def data_format_default(data: bytes) -> bytes:
    """The bytes unchanged (dataflux's default ``data_format_fn``)."""
    return data


def check_names(owner: str, project_name: Any, storage_client: Any, bucket_name: Any = "-") -> None:
    """Check the arguments every dataflux constructor takes.

    Raises:
        ConfigError: ``project_name`` is not a string (or ``None``) or
            ``bucket_name`` is not a string.
    """
    check_instance(project_name, str, owner=owner, parameter="project_name")
    check_instance(bucket_name, str, owner=owner, parameter="bucket_name", optional=False)
    if storage_client is not None:
        logger.debug("%s: storage_client is not used; torchbucket makes its own requests", owner)


def bucket_uri(bucket_name: str, key: str = "") -> str:
    """``gs://bucket/key``; a ``bucket_name`` that is already a URI (``memory://x``) is joined."""
    if "://" in bucket_name:
        return bucket_name.rstrip("/") + "/" + key
    return f"gs://{bucket_name}/{key}"


def retry_config(value: Any) -> RetryConfig | None:
    """A ``RetryConfig`` from ours or from a ``google.api_core`` ``Retry``.

    The ``Retry``'s initial and maximum delay, multiplier and timeout (its
    ``_deadline`` in older ``google-api-core``) carry over; its predicate does
    not: torchbucket retries what Google's retry strategy says to retry.
    """
    if value is None or isinstance(value, RetryConfig):
        return value
    deadline = getattr(value, "_timeout", None) or getattr(value, "_deadline", None)
    return RetryConfig(
        initial_backoff=float(getattr(value, "_initial", 1.0)),
        max_backoff=float(getattr(value, "_maximum", 60.0)),
        multiplier=max(1.0, float(getattr(value, "_multiplier", 2.0))),
        deadline=float(deadline) if deadline else RetryConfig().deadline,
    )


def gcs_config_for(
    owner: str, gcs: GCSConfig | None, retry: RetryConfig | None = None
) -> GCSConfig:
    """The ``GCSConfig`` to use: ``gcs`` (default ``GCSConfig()``) with ``retry``.

    dataflux's ``project_name`` is not sent as ``x-goog-user-project``: the
    ``google-cloud-storage`` client dataflux builds from it does not send it
    either, and that header needs ``serviceusage.services.use`` on the project
    (https://cloud.google.com/apis/docs/system-parameters). A requester-pays
    bucket takes ``GCSConfig(project=...)``.
    """
    check_gcs_config(gcs, owner=owner)
    from torchbucket.storage.gcs import GCSConfig

    resolved = gcs if gcs is not None else GCSConfig()
    return dataclasses.replace(resolved, retry=retry) if retry is not None else resolved


class ConfigBase:
    """The fields of dataflux's two ``Config`` classes (see their subclasses)."""

    def _set(
        self,
        sort_listing_results: bool,
        max_composite_object_size: int | None,
        num_processes: int | None,
        prefix: str | None,
        max_listing_retries: int,
        threads_per_process: int,
        disable_compose: bool,
        list_retry_config: Any,
        download_retry_config: Any,
    ) -> None:
        owner = type(self).__name__
        check_instance(prefix, str, owner=owner, parameter="prefix")
        check_instance(
            max_composite_object_size, int, owner=owner, parameter="max_composite_object_size"
        )
        self.sort_listing_results = sort_listing_results
        # As in dataflux, disable_compose shows as a cap of 0.
        self.max_composite_object_size = 0 if disable_compose else max_composite_object_size
        self.num_processes = num_processes
        self.prefix = prefix
        self.max_listing_retries = max_listing_retries
        self.threads_per_process = threads_per_process
        self.disable_compose = disable_compose
        self.list_retry_config = list_retry_config
        self.download_retry_config = download_retry_config

    def compose_config(self) -> ComposeConfig | None:
        """The :class:`ComposeConfig` these settings mean, or ``None``: the dataset's own default.

        ``max_composite_object_size`` ``None`` (the default) leaves each
        dataset its measured default (the iterable dataset composes; the
        map-style one composes when it reads ahead, never batch at a time);
        ``0`` or ``disable_compose`` turn compose off, as in dataflux
        (``ComposeConfig`` itself says so with ``enabled=False``).
        """
        cap = self.max_composite_object_size
        if self.disable_compose or cap == 0:
            return ComposeConfig(enabled=False)
        if cap is None:
            return None
        return ComposeConfig(max_composite_object_size=int(cap))

    def retry(self) -> RetryConfig | None:
        """The retry policy: ``download_retry_config`` wins, as one store serves both."""
        return retry_config(self.download_retry_config) or retry_config(self.list_retry_config)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class ObjectList(list[tuple[str, int]]):
    """``dataset.objects``: a plain list of ``(name, size)`` that notes its own changes."""

    changed = False


def _marking(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def marked(self: ObjectList, *args: Any, **kwargs: Any) -> Any:
        self.changed = True
        return method(self, *args, **kwargs)

    marked.__name__ = name
    return marked


for _name in (
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__imul__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
):
    setattr(ObjectList, _name, _marking(_name))


class _Names:
    """The names of a sorted catalog as a sequence, for ``bisect``."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def __len__(self) -> int:
        return len(self._catalog)

    def __getitem__(self, index: SupportsIndex) -> str:
        return self._catalog.name(int(index))


def _catalog_of(listed: Catalog, objects: Iterable[tuple[str, int]]) -> Catalog:
    """A catalog of ``objects``, pinned to the listed generation where one was listed."""
    from torchbucket.datasets.catalog import Catalog
    from torchbucket.storage.base import ObjectInfo

    names = _Names(listed)
    infos = []
    for name, size in objects:
        i = bisect.bisect_left(names, name)
        listed_here = i < len(names) and names[i] == name and int(listed.sizes[i]) == size
        # A listed object keeps all it was listed with (generation included).
        infos.append(listed.info(i) if listed_here else ObjectInfo(name=name, size=int(size)))
    return Catalog(listed.stores[:1], [0] * len(infos), infos)


class ListedObjects:
    """dataflux's ``objects`` attribute over a dataset's catalog.

    ``objects`` is a real list of ``(name, size)``, built on first access and
    kept. Assigning another list, or changing this one in place, changes what
    the dataset reads, as in dataflux; the names are bucket-relative and the
    reads of objects from the original listing stay pinned to their listed
    generation (others read the live object).
    """

    _catalog: Catalog
    _listed: Catalog
    _objects: ObjectList | None

    def _adopt(
        self,
        project_name: str | None,
        bucket_name: str,
        config: ConfigBase,
        data_format_fn: Callable[[bytes], Any],
        storage_client: Any,
        gcs: GCSConfig | None,
    ) -> tuple[Catalog, ComposeConfig | None]:
        """Check and keep dataflux's public attributes; list the prefix."""
        from torchbucket.datasets.catalog import Catalog

        owner = type(self).__name__
        check_names(owner, project_name, storage_client, bucket_name)
        check_callable(data_format_fn, owner=owner, parameter="data_format_fn")
        self.project_name = project_name
        self.bucket_name = bucket_name
        self.config = config
        self.data_format_fn = data_format_fn
        self.storage_client = None  # never pickled, never used
        uri = bucket_uri(bucket_name, config.prefix or "")
        resolved = gcs_config_for(owner, gcs, config.retry())
        # dataflux gives an empty dataset for an empty prefix.
        self._listed = Catalog.from_prefix(uri, gcs=resolved, allow_empty=True)
        self._objects = None
        return self._listed, config.compose_config()

    @property
    def objects(self) -> list[tuple[str, int]]:
        """``(name, size)`` of each object, bucket-relative, in listing order."""
        if self._objects is None:
            catalog = self._catalog
            names = [catalog.name(i) for i in range(len(catalog))]
            self._objects = ObjectList(zip(names, catalog.sizes.tolist(), strict=True))
        return self._objects

    @objects.setter
    def objects(self, value: Iterable[tuple[str, int]]) -> None:
        self._objects = ObjectList((str(name), int(size)) for name, size in value)
        self._objects.changed = True

    def _sync(self) -> None:
        """Read what ``objects`` holds now, if it changed since last read."""
        objects = self._objects
        if objects is not None and objects.changed:
            self._catalog = _catalog_of(self._listed, objects)
            objects.changed = False

    def __getstate__(self) -> dict[str, Any]:
        self._sync()
        parent = getattr(super(), "__getstate__", None)
        state = dict(parent() if parent is not None else self.__dict__)
        if self._catalog is self._listed:
            state["_objects"] = None  # rebuilt from the catalog on demand
        return state
