"""The listing cache: a manifest of one listing, to skip listing again.

A manifest is one gzipped JSON document holding the prefix URI it lists, the
filters applied, when it was written and the objects, column by column
(:mod:`._columns`: names, sizes, generations, CRC32Cs, storage classes): a
million objects take about 30 MB before compression. It lives in a local file or in an object of a bucket.

Staleness is the user's choice: a manifest is read back as it was written, so
objects added, changed or removed since are not seen. That is why the cache is
opt-in, keyed by prefix URI and filters (a manifest of another listing is
ignored), and can be given a maximum age.

A manifest in a bucket is written by whoever may write there, so what is read
back is checked as input: one that names an object outside the prefix it
lists (it would send reads elsewhere in the bucket), or that decompresses past
:data:`_MAX_BYTES` (a decompression bomb), is not used, with a WARNING naming
it, and the prefix is listed again.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import logging
import os
import tempfile
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from torchbucket._uri import parse_uri
from torchbucket.errors import NotFoundError, StorageError
from torchbucket.listing._columns import decode_objects, encode_objects
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["ManifestLocation"]

logger = logging.getLogger(__name__)

_FORMAT = "torchbucket-listing"
# 2: objects carry their content encodings (a version 1 manifest lacks them,
# and would have gzip objects composed: it is listed again).
_VERSION = 2
#: The most bytes a manifest may decompress to: 14 to 35 million objects (30
#: to 75 bytes each, by their names), whose listing would hold several GB as
#: ``ObjectInfo`` anyway. A bomb inflates no further; the prefix is listed again.
_MAX_BYTES = 1 << 30


class ManifestLocation:
    """Where a manifest lives: a local path or an object (``gs://``, ``memory://``).

    Args:
        location: A local path, ``file:///path``, or an object URI.
        store: The store being listed; used for an object in the same bucket.
    """

    def __init__(self, location: str | os.PathLike[str], store: ObjectStore) -> None:
        text = os.fspath(location)
        self.description = text
        self._path: str | None = None
        self._store: ObjectStore | None = None
        self._key = ""
        if "://" not in text:
            self._path = text
            return
        if text.startswith("file://"):
            self._path = "/" + parse_uri(text).key
            return
        parsed = parse_uri(text)
        self._key = parsed.key
        if store.uri(parsed.key) == text:
            self._store = store
        else:
            from torchbucket.storage import store_for

            self._store, self._key = store_for(parsed)

    def is_object(self, store: ObjectStore, name: str) -> bool:
        """Whether ``name`` in ``store`` is this manifest itself."""
        return self._store is store and self._key == name

    async def read(
        self, uri: str, prefix: str, filters: Mapping[str, Any], max_age: float | None
    ) -> list[ObjectInfo] | None:
        """The cached listing of ``uri`` (``prefix``) under ``filters``, or ``None`` on a miss.

        A miss too: a manifest that is unreadable, too large, or names an
        object not under ``prefix`` (logged as a WARNING naming it).
        """
        try:
            if self._path is not None:
                data = await asyncio.to_thread(_read_file, self._path)
            else:
                assert self._store is not None
                data = await self._store.get(self._key)
        except (FileNotFoundError, NotFoundError):
            return None
        try:
            doc = json.loads(_decompress(data))
            if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
                raise ValueError("not a torchbucket listing manifest")
            if doc.get("uri") != uri or doc.get("filters") != dict(filters):
                logger.info(
                    "listing cache %s holds another listing; listing again", self.description
                )
                return None
            age = time.time() - float(doc["created"])
            if max_age is not None and age > max_age:
                logger.info("listing cache %s is %.0f s old; listing again", self.description, age)
                return None
            objects = decode_objects(doc["objects"])
            stray = next((o.name for o in objects if not o.name.startswith(prefix)), None)
            if stray is not None:
                raise ValueError(f"it names {stray!r}, which is not under {uri}")
        except (ValueError, KeyError, TypeError, OSError, EOFError, zlib.error) as exc:
            logger.warning(
                "listing cache %s is unreadable (%s); listing again", self.description, exc
            )
            return None
        logger.info("listed %s from the cache %s (%d objects)", uri, self.description, len(objects))
        return objects

    async def write(
        self, uri: str, filters: Mapping[str, Any], objects: Sequence[ObjectInfo]
    ) -> None:
        """Store ``objects`` as the listing of ``uri``; failures are logged, not raised."""
        doc = {
            "format": _FORMAT,
            "version": _VERSION,
            "uri": uri,
            "filters": dict(filters),
            "created": time.time(),
            "objects": encode_objects(objects),
        }
        data = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=1)
        try:
            if self._path is not None:
                await asyncio.to_thread(_write_file, self._path, data)
            else:
                assert self._store is not None
                await self._store.put(self._key, data, content_type="application/gzip")
        except (OSError, StorageError) as exc:
            # The listing itself succeeded; a cache that cannot be written only
            # costs the next job a listing.
            logger.warning("could not write the listing cache %s: %s", self.description, exc)


def _decompress(data: bytes) -> bytes:
    """``data`` gunzipped, refused past :data:`_MAX_BYTES` before more is inflated."""
    parts: list[bytes] = []
    total = 0
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > _MAX_BYTES:
                raise ValueError(f"it decompresses to more than {_MAX_BYTES} bytes")
            parts.append(chunk)
    return b"".join(parts)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_file(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tbmanifest-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
