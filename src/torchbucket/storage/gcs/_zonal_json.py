"""A zonal bucket's pointers over the JSON API, for a process that cannot use gRPC.

A DataLoader worker forked after its parent used gRPC takes the JSON API
(:mod:`._route`). On a zonal bucket the names it reads may be pointers
(:mod:`._pointers`): empty objects whose metadata names the data object that
holds the bytes. A listing made anywhere reports the data object's size,
CRC32C and generation under the pointer's name, so a plain JSON read of the
name would find an empty object, or (pinned to the generation listed) no such
generation. Here the name is asked once (one metadata request) and a pointer
followed, as the gRPC path follows it; a pinned read of a data object already
followed asks nothing more (a data object's generation never changes).
"""

from __future__ import annotations

import json
from typing import Any

from torchbucket.errors import NotFoundError
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import _errors
from torchbucket.storage.gcs._pointers import listed_info, pointed
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, object_info, quote_name

__all__ = ["JsonPointers"]

_QUERY = "fields=" + quote_name(f"{INFO_FIELDS},metadata")


class JsonPointers:
    """Pointers of one zonal bucket followed over the JSON API (see the module)."""

    def __init__(self, transport: GCSTransport) -> None:
        self._t = transport
        #: name -> (data object, its generation) followed, for pinned reads.
        self._known: dict[str, tuple[str, int]] = {}

    async def head(self, key: str) -> ObjectInfo:
        """``key``'s metadata, a pointer's data object's for a pointer."""
        url = self._t.urls.object_url(key, _QUERY)
        uri = self._t.urls.uri(key)

        def parse(body: bytes) -> tuple[dict[str, Any], ObjectInfo]:
            doc = json.loads(body)
            return doc, object_info(doc)

        async def attempt() -> tuple[dict[str, Any], ObjectInfo]:
            _, _, body = await self._t.request("GET", url, operation="head", uri=uri)
            return _errors.parse_body(parse, body, operation="head", uri=uri)

        doc, info = await self._t.call(attempt, "head", uri)
        target = pointed(doc.get("metadata") or {}, key)
        if target is None:
            self._known.pop(key, None)
        else:
            self._known[key] = (target[0], target[1])
        return listed_info(doc, info)

    def followed(self, key: str, generation: int) -> bool:
        """Whether ``key`` at ``generation`` is a pointer's data object already followed."""
        known = self._known.get(key)
        return known is not None and known[1] == generation

    async def resolve(self, key: str, generation: int | None) -> tuple[str, int | None]:
        """The object and generation to read for ``key`` at ``generation``.

        Raises:
            NotFoundError: No such object, or ``generation`` is not the one
                the pointer names now.
        """
        known = self._known.get(key)
        if known is not None and generation is not None and known[1] == generation:
            return known
        info = await self.head(key)
        known = self._known.get(key)
        if known is None:
            return key, generation
        if generation is not None and generation != info.generation:
            raise NotFoundError(
                f"generation {generation} is gone",
                operation="get",
                uri=self._t.urls.uri(key),
                status=404,
            )
        return known
