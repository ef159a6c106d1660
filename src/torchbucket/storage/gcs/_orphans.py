"""Data objects of a zonal bucket that no pointer names: what ``torchbucket cleanup`` removes.

A save killed between creating its data object and writing its pointer (see
:mod:`._zonal`) leaves the data object, billed and hidden from listings. One
is an orphan when the pointer at its key (:func:`._pointers.pointer_key`) does
not name it; a long key's data object (a hashed name) is an orphan when no
pointer in the bucket names it (one listing of the whole bucket, only where
there is such a data object). Listing, metadata and deletes take the JSON API.

A data object of a save still running has no pointer yet: ``older_than``
spares one written, appended to or finalized within that time, and the pointer
is asked again right before each delete, which names the generation listed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import yarl

from torchbucket.errors import NotFoundError
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import _errors, _objects
from torchbucket.storage.gcs._pointers import POINTER_PREFIX, hashed, pointed, pointer_key
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, object_infos, quote_name

__all__ = ["Orphan", "find_orphans", "remove_orphans"]

#: A data object no pointer names, and when it was last written (seconds since the epoch).
Orphan = tuple[ObjectInfo, float | None]

_PARALLELISM = 16
_TIMES = ("timeCreated", "updated", "timeFinalized")
_DATA_FIELDS = f"items({INFO_FIELDS},{','.join(_TIMES)}),nextPageToken"
_POINTER_FIELDS = "items(name,metadata),nextPageToken"


async def _pages(transport: GCSTransport, prefix: str, fields: str) -> AsyncIterator[Any]:
    """The items of every page of ``objects.list`` under ``prefix`` (hidden names included)."""
    token: str | None = None
    uri = transport.urls.uri(prefix)
    while True:
        query = f"maxResults=1000&fields={quote_name(fields)}"
        for name, value in (("prefix", prefix), ("pageToken", token)):
            if value:
                query += f"&{name}=" + quote_name(value)
        url = yarl.URL(f"{transport.urls.json_base}/o?{query}", encoded=True)

        async def attempt(url: yarl.URL = url) -> Any:
            _, _, body = await transport.request(
                "GET", url, operation="list", uri=uri, bucket_op=True
            )
            return _errors.parse_body(json.loads, body, operation="list", uri=uri)

        doc = await transport.call(attempt, "list", uri)
        yield doc.get("items", [])
        token = doc.get("nextPageToken") or None
        if token is None:
            return


def _stamp(doc: dict[str, Any]) -> float | None:
    """The latest of the object's creation, update and finalize times."""
    stamps = [_objects.rfc3339_seconds(doc[t]) for t in _TIMES if isinstance(doc.get(t), str)]
    known = [s for s in stamps if s is not None]
    return max(known) if known else None


async def _named_by(transport: GCSTransport, key: str) -> str | None:
    """The data object the pointer at ``key`` names now; ``None`` for none."""
    url = transport.urls.object_url(key, "fields=metadata")
    uri = transport.urls.uri(key)

    async def attempt() -> str | None:
        status, _, body = await transport.request(
            "GET", url, operation="head", uri=uri, allow=(404,)
        )
        if status == 404:
            return None
        doc = _errors.parse_body(json.loads, body, operation="head", uri=uri)
        target = pointed(doc.get("metadata") or {}, key)
        return None if target is None else target[0]

    return await transport.call(attempt, "head", uri)


async def _all_targets(transport: GCSTransport) -> set[str]:
    """The data objects every pointer in the bucket names."""
    targets: set[str] = set()
    async for items in _pages(transport, "", _POINTER_FIELDS):
        for doc in items:
            target = pointed(doc.get("metadata") or {}, doc.get("name") or "")
            if target is not None:
                targets.add(target[0])
    return targets


async def _unnamed(transport: GCSTransport, infos: Sequence[ObjectInfo]) -> list[ObjectInfo]:
    """Those of ``infos`` (data objects) no pointer names, asked now."""
    semaphore = asyncio.Semaphore(_PARALLELISM)

    async def named(info: ObjectInfo) -> bool:
        async with semaphore:
            return await _named_by(transport, pointer_key(info.name) or "") == info.name

    flags = await gather_or_cancel(named(info) for info in infos)
    left = [info for info, flag in zip(infos, flags, strict=True) if not flag]
    if any(hashed(info.name) for info in left):
        targets = await _all_targets(transport)
        left = [info for info in left if info.name not in targets]
    return left


async def find_orphans(
    transport: GCSTransport, prefix: str, older_than: float, now: float | None
) -> list[Orphan]:
    """The data objects of keys under ``prefix`` that no pointer names, by name.

    Args:
        transport: The bucket's transport.
        prefix: Keys that start with this (``""``: the whole bucket, long keys' too).
        older_than: Only those last written at least this many seconds ago; one
            of unknown age is spared then.
        now: The current time (seconds since the epoch); the clock when ``None``.
    """
    cutoff = (time.time() if now is None else now) - older_than
    found: list[Orphan] = []
    async for items in _pages(transport, POINTER_PREFIX + prefix, _DATA_FIELDS):
        for doc, info in zip(items, object_infos(items), strict=True):
            stamp = _stamp(doc)
            old = older_than <= 0 or (stamp is not None and stamp <= cutoff)
            if old and pointer_key(info.name) is not None:
                found.append((info, stamp))
    unnamed = {info.name for info in await _unnamed(transport, [i for i, _ in found])}
    return sorted((o for o in found if o[0].name in unnamed), key=lambda o: o[0].name)


async def remove_orphans(transport: GCSTransport, orphans: Sequence[Orphan]) -> tuple[int, int]:
    """Delete ``orphans`` that no pointer names still, each the generation listed.

    Returns:
        How many data objects, and bytes, this call deleted.
    """
    semaphore = asyncio.Semaphore(_PARALLELISM)
    infos = [info for info, _ in orphans]
    long_keys = {i.name for i in await _unnamed(transport, [i for i in infos if hashed(i.name)])}

    async def remove(info: ObjectInfo) -> int:
        async with semaphore:
            if not hashed(info.name):
                # Right before the delete: a pointer written since keeps it.
                if await _named_by(transport, pointer_key(info.name) or "") == info.name:
                    return -1
            elif info.name not in long_keys:
                return -1
            try:
                await _objects.delete(transport, info.name, info.generation)
            except NotFoundError:
                return -1  # gone already
            return info.size

    sizes = [n for n in await gather_or_cancel(remove(info) for info in infos) if n >= 0]
    return len(sizes), sum(sizes)
