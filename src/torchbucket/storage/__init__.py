"""The storage seam: the :class:`ObjectStore` protocol and its backends.

``store_for(uri)`` turns a URI into a store and a key::

    store, key = store_for("gs://my-bucket/train/")
"""

from __future__ import annotations

from typing import Any

from torchbucket._uri import ObjectURI, parse_uri
from torchbucket.errors import ConfigError
from torchbucket.storage.base import (
    COMPOSE_MAX_SOURCES,
    HIDDEN_PREFIXES,
    MULTIPART_MAX_PARTS,
    ListPage,
    MultipartUpload,
    ObjectInfo,
    ObjectStore,
    Part,
)
from torchbucket.storage.capabilities import (
    RemoteStore,
    SupportsBucketInfo,
    SupportsBuckets,
    SupportsCreationTime,
    SupportsFolders,
    SupportsSoftDelete,
    SupportsZonal,
    UncheckedMultipartAssembly,
)
from torchbucket.storage.memory import MemoryStore

__all__ = [
    "COMPOSE_MAX_SOURCES",
    "HIDDEN_PREFIXES",
    "MULTIPART_MAX_PARTS",
    "ListPage",
    "MemoryStore",
    "MultipartUpload",
    "ObjectInfo",
    "ObjectStore",
    "Part",
    "RemoteStore",
    "SupportsBucketInfo",
    "SupportsBuckets",
    "SupportsCreationTime",
    "SupportsFolders",
    "SupportsSoftDelete",
    "SupportsZonal",
    "UncheckedMultipartAssembly",
    "store_for",
]


def store_for(uri: str | ObjectURI, **options: Any) -> tuple[ObjectStore, str]:
    """Open the store a URI points into.

    Args:
        uri: ``gs://bucket/key``, ``memory://name/key`` or ``file:///path``.
        **options: Passed to the backend: for ``gs://`` a ``config``
            (:class:`~torchbucket.storage.gcs.GCSConfig`).

    Returns:
        The store and the key (object name or prefix) inside it.

    Raises:
        InvalidURIError: The URI is malformed.
        ConfigError: An option the backend does not take.
    """
    parsed = uri if isinstance(uri, ObjectURI) else parse_uri(uri)
    if parsed.scheme == "gs":
        from torchbucket.storage.gcs import GCSStore

        return GCSStore(parsed.bucket, **options), parsed.key
    if options:
        raise ConfigError(
            f"{parsed.scheme}:// stores take no options, got {', '.join(sorted(options))}"
        )
    if parsed.scheme == "memory":
        return MemoryStore(parsed.bucket), parsed.key
    from torchbucket.storage.local import LocalStore

    return LocalStore(), parsed.key
