"""The list of objects a dataset reads, held compactly.

Names live in one UTF-8 blob with an offsets array, sizes and generations in
numpy arrays: a million objects cost a few tens of MB, pickle quickly to spawned
workers, and reading entries touches no Python object refcounts, so forked
DataLoader workers do not slowly copy the parent's pages (the classic
"DataLoader memory leak" of a list of Python objects).

Not user API: the datasets, and the dataflux-compatible datasets built on
them, share it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from torchbucket import runtime
from torchbucket._uri import as_uri, parse_uri
from torchbucket.errors import ConfigError, NotFoundError
from torchbucket.listing import alist_objects
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage import store_for
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.crc32c import b64, from_b64

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["Catalog", "open_store"]

_NO_GENERATION = -1
_NO_CRC = -1


def _crc_value(crc32c: str | None) -> int:
    """A listed CRC32C (base64, big-endian) as an int; ``_NO_CRC`` when unknown."""
    if crc32c is None:
        return _NO_CRC
    try:
        return from_b64(crc32c)
    except ValueError:
        return _NO_CRC


def _crc_b64(value: int) -> str | None:
    return None if value == _NO_CRC else b64(value)


def empty_prefix_hint(given: str | os.PathLike[str]) -> str:
    """Why a prefix the user gave may have matched nothing, or ``""``.

    The two mistakes a first run makes: a glob (listings match a prefix,
    nothing expands ``*``), and a bucket path without ``gs://``, which is read
    as a local folder relative to the working directory.
    """
    text = os.fspath(given)
    if any(c in text for c in "*?"):
        return "; wildcards are not expanded: give the prefix the names start with"
    if "://" not in text and not os.path.exists(text):
        return (
            f"; {text!r} has no scheme, so it was read as a local path"
            f" (for a bucket: gs://{text.lstrip('/')})"
        )
    return ""


def open_store(uri: str, gcs: GCSConfig | None) -> tuple[ObjectStore, str]:
    """The store and key of ``uri``; ``gcs`` applies to ``gs://`` only."""
    parsed = parse_uri(uri)
    if parsed.scheme == "gs" and gcs is not None:
        return store_for(parsed, config=gcs)
    return store_for(parsed)


class Catalog:
    """Objects by index: store, name, size, generation and CRC32C as listed.

    Args:
        stores: The stores the objects live in.
        store_ids: Per object, its index into ``stores``.
        infos: The objects as listed.
    """

    def __init__(
        self, stores: Sequence[ObjectStore], store_ids: Sequence[int], infos: Sequence[ObjectInfo]
    ) -> None:
        encoded = [info.name.encode("utf-8") for info in infos]
        self.stores = list(stores)
        self._blob = b"".join(encoded)
        self._offsets: npt.NDArray[np.int64] = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self._offsets[1:])
        self.sizes: npt.NDArray[np.int64] = np.fromiter(
            (info.size for info in infos), dtype=np.int64, count=len(infos)
        )
        self._generations: npt.NDArray[np.int64] = np.fromiter(
            (_NO_GENERATION if info.generation is None else info.generation for info in infos),
            dtype=np.int64,
            count=len(infos),
        )
        # What a large object's parallel ranges are checked against as a whole.
        self._crcs: npt.NDArray[np.int64] = np.fromiter(
            (_crc_value(info.crc32c) for info in infos), dtype=np.int64, count=len(infos)
        )
        self._store_ids: npt.NDArray[np.int32] | None = (
            np.asarray(store_ids, dtype=np.int32) if len(self.stores) > 1 else None
        )
        # Objects GCS serves decoded (Content-Encoding: gzip): rare, so a set
        # of indices, and empty (nothing per object) in the usual case.
        self.transcoded: frozenset[int] = frozenset(
            i
            for i, info in enumerate(infos)
            if info.content_encoding is not None and info.transcoded
        )

    def __len__(self) -> int:
        return len(self.sizes)

    def name(self, i: int) -> str:
        """The object name at index ``i``."""
        return self._blob[self._offsets[i] : self._offsets[i + 1]].decode("utf-8")

    def store_id(self, i: int) -> int:
        """Index into :attr:`stores` of the object at ``i``."""
        return 0 if self._store_ids is None else int(self._store_ids[i])

    def store(self, i: int) -> ObjectStore:
        """The store of the object at ``i``."""
        return self.stores[self.store_id(i)]

    def info(self, i: int) -> ObjectInfo:
        """The object at ``i`` as listed."""
        generation = int(self._generations[i])
        return ObjectInfo(
            name=self.name(i),
            size=int(self.sizes[i]),
            generation=None if generation == _NO_GENERATION else generation,
            crc32c=_crc_b64(int(self._crcs[i])),
            content_encoding="gzip" if i in self.transcoded else None,
        )

    def uri(self, i: int) -> str:
        """The URI of the object at ``i``, for messages."""
        return self.store(i).uri(self.name(i))

    def select(self, indices: npt.NDArray[np.int64]) -> Catalog:
        """The objects at ``indices`` (in range), in that order: a part of this listing.

        Nothing is listed or looked up again; the stores are shared.
        """
        part = Catalog.__new__(Catalog)
        part.stores = list(self.stores)
        starts = self._offsets[indices]
        ends = self._offsets[indices + 1]
        blob = self._blob
        part._blob = b"".join([blob[s:e] for s, e in zip(starts.tolist(), ends.tolist())])
        part._offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=part._offsets[1:])
        part.sizes = self.sizes[indices]
        part._generations = self._generations[indices]
        part._crcs = self._crcs[indices]
        part._store_ids = None if self._store_ids is None else self._store_ids[indices]
        gz = self.transcoded
        part.transcoded = (
            frozenset(k for k, i in enumerate(indices.tolist()) if i in gz) if gz else frozenset()
        )
        return part

    @classmethod
    def from_prefix(
        cls,
        uri: str | os.PathLike[str],
        *,
        gcs: GCSConfig | None = None,
        listing: ListingConfig | None = None,
        allow_empty: bool = False,
    ) -> Catalog:
        """List every object under a prefix URI.

        Args:
            uri: The prefix URI, or a local path (a ``pathlib.Path``,
                ``/data/train``), read as ``file://`` (a directory: its files).
            gcs: How to reach GCS, for ``gs://``.
            listing: How to list.
            allow_empty: Return an empty catalog when nothing is under the
                prefix, instead of raising.

        Raises:
            NotFoundError: Nothing is under the prefix (unless ``allow_empty``).
        """
        given = uri
        uri = as_uri(uri, directory=True)
        store, prefix = open_store(uri, gcs)
        infos = runtime.run(alist_objects(store, prefix, config=listing))
        if not infos and not allow_empty:
            raise NotFoundError(
                "no objects under this prefix" + empty_prefix_hint(given),
                operation="list",
                uri=uri,
            )
        return cls([store], [0] * len(infos), infos)

    @classmethod
    def from_objects(
        cls, uris: Sequence[str | os.PathLike[str]], *, gcs: GCSConfig | None = None
    ) -> Catalog:
        """Look up the objects named by ``uris`` (concurrently), in that order.

        A local path (a ``pathlib.Path``, ``/data/x.png``) is read as ``file://``.

        Raises:
            ConfigError: ``uris`` is empty or a single string.
            NotFoundError: An object does not exist.
        """
        if isinstance(uris, (str, os.PathLike)):
            raise ConfigError("from_objects takes a sequence of URIs, got a single one")
        texts = [as_uri(uri) for uri in uris]
        if not texts:
            raise ConfigError("from_objects needs at least one object URI")
        stores: dict[tuple[str, str], int] = {}
        store_list: list[ObjectStore] = []
        store_ids: list[int] = []
        keys: list[str] = []
        for uri in texts:
            parsed = parse_uri(uri)
            where = (parsed.scheme, parsed.bucket)
            if where not in stores:
                stores[where] = len(store_list)
                store_list.append(open_store(uri, gcs)[0])
            store_ids.append(stores[where])
            keys.append(parsed.key)

        async def head_all() -> list[ObjectInfo]:
            return await gather_or_cancel(
                store_list[s].head(k) for s, k in zip(store_ids, keys, strict=True)
            )

        infos = runtime.run(head_all())
        return cls(store_list, store_ids, infos)
