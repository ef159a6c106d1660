"""Server-side object operations of the GCS store: compose, copy (rewrite), delete.

Also an object's creation time (:func:`created`), which ``torchbucket cleanup``
asks for to tell a leftover from an object a running job still uses.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Sequence
from typing import Any

import yarl

from torchbucket.errors import IntegrityError, NotFoundError, RetryableError, StorageError
from torchbucket.storage._common import check_compose_sources
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.crc32c import combine, from_b64
from torchbucket.storage.gcs import _errors, _uncertain
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, crc_b64, object_info, quote_name

__all__ = [
    "combined_crc32c",
    "compose",
    "copy",
    "created",
    "delete",
    "delete_url",
    "rfc3339_seconds",
]

# RFC 3339 as GCS writes times ("2024-05-01T12:00:00.123Z"), any fraction, any offset.
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(\.\d+)?(?:[Zz]|([+-])(\d\d):(\d\d))"
)


def combined_crc32c(sources: Sequence[ObjectInfo]) -> str | None:
    """The CRC32C of the sources' bytes in order, or ``None`` if one lacks its own."""
    crc = 0
    for source in sources:
        if source.crc32c is None:
            return None
        try:
            value = from_b64(source.crc32c)
        except ValueError:
            return None
        crc = combine(crc, value, source.size)
    return crc_b64(crc)


async def compose(
    transport: GCSTransport,
    destination: str,
    sources: Sequence[ObjectInfo],
    *,
    if_generation_match: int | None = None,
) -> ObjectInfo:
    check_compose_sources(sources)
    source_docs = []
    for source in sources:
        doc: dict[str, Any] = {"name": source.name}
        if source.generation is not None:
            doc["generation"] = source.generation
            doc["objectPreconditions"] = {"ifGenerationMatch": source.generation}
        source_docs.append(doc)
    body = json.dumps(
        {
            "sourceObjects": source_docs,
            "destination": {"contentType": "application/octet-stream"},
        }
    ).encode()
    query = "fields=" + quote_name(INFO_FIELDS)
    if if_generation_match is not None:
        query += f"&ifGenerationMatch={if_generation_match}"
    url = yarl.URL(
        f"{transport.urls.object_base}{quote_name(destination)}/compose?{query}", encoded=True
    )
    headers = {"Content-Type": "application/json"}
    uri = transport.urls.uri(destination)

    # GCS checks that the sources are correctly assembled itself and
    # documents no checksum of the result to send with a compose (an MD5 is
    # ignored: https://cloud.google.com/storage/docs/composite-objects,
    # "Integrity checking composite objects"); the composite's CRC32C is
    # compared here with the combination of its sources'.
    expected = combined_crc32c(sources)

    async def attempt() -> ObjectInfo:
        _, _, resp = await transport.request(
            "POST", url, operation="compose", uri=uri, headers=headers, data=body
        )
        info = _errors.parse_info(resp, operation="compose", uri=uri)
        if expected is not None and info.crc32c is not None and info.crc32c != expected:
            raise IntegrityError(
                f"the composite's CRC32C is {info.crc32c}, its sources' combine to {expected}",
                operation="compose",
                uri=uri,
            )
        return info

    if if_generation_match is None:
        # Without a precondition a repeat could not be told from another
        # writer's compose by its size alone: not retried.
        return await transport.call(attempt, "compose", uri, idempotent=False)

    async def send(precondition: int | None) -> ObjectInfo:
        return await attempt()

    return await _uncertain.write(
        transport,
        send,
        destination,
        size=sum(s.size for s in sources),
        crc32c=None,
        if_generation_match=if_generation_match,
        operation="compose",
    )


def rfc3339_seconds(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time, ``None`` if ``text`` is not one."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, sign, off_h, off_m = match.groups()[6:]
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if sign is not None:
        offset = int(off_h) * 3600 + int(off_m) * 60
        seconds -= offset if sign == "+" else -offset
    return seconds + (float(fraction) if fraction else 0.0)


def _time_created(body: bytes) -> float | None:
    value = json.loads(body).get("timeCreated")
    return rfc3339_seconds(value) if isinstance(value, str) else None


async def created(transport: GCSTransport, key: str, generation: int | None) -> float | None:
    """When ``key`` (``generation`` of it, if given) was written: its ``timeCreated``.

    ``timeCreated`` is the creation time of the object resource, which a
    rewrite or a new upload replaces with a new generation
    (https://cloud.google.com/storage/docs/json_api/v1/objects#resource).
    One ``objects.get`` of metadata (class B).

    Returns:
        Seconds since the epoch, or ``None`` where the answer has no readable time.

    Raises:
        NotFoundError: No such object (or generation).
    """
    query = "fields=timeCreated" + ("" if generation is None else f"&generation={generation}")
    url = transport.urls.object_url(key, query)
    uri = transport.urls.uri(key)

    async def attempt() -> float | None:
        _, _, body = await transport.request("GET", url, operation="head", uri=uri)
        return _errors.parse_body(_time_created, body, operation="head", uri=uri)

    return await transport.call(attempt, "head", uri)


async def delete(transport: GCSTransport, key: str, generation: int | None) -> None:
    url = transport.urls.object_url(key, "" if generation is None else f"generation={generation}")
    await delete_url(
        transport, url, "delete", transport.urls.uri(key), idempotent=generation is not None
    )


async def delete_url(
    transport: GCSTransport, url: yarl.URL, operation: str, uri: str, *, idempotent: bool = True
) -> None:
    """Send a DELETE of ``url`` with retries; a 404 after a lost answer means it was done.

    Raises:
        NotFoundError: The first attempt found nothing to delete.
    """
    ambiguous = False

    async def attempt() -> None:
        nonlocal ambiguous
        try:
            await transport.request("DELETE", url, operation=operation, uri=uri)
        except NotFoundError:
            if not ambiguous:
                raise
            # A retry of a delete whose answer was lost: that one deleted it.
        except RetryableError:
            ambiguous = True
            raise

    await transport.call(attempt, operation, uri, idempotent=idempotent)


async def copy(
    transport: GCSTransport, source: str, destination: str, source_generation: int | None
) -> ObjectInfo:
    # ``sourceGeneration``: a source replaced since is a 404, never the copy's bytes
    # (https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite).
    pinned = "" if source_generation is None else f"sourceGeneration={source_generation}&"
    base = (
        f"{transport.urls.object_base}{quote_name(source)}/rewriteTo/b/"
        f"{quote_name(transport.bucket)}/o/{quote_name(destination)}?{pinned}fields="
        + quote_name(f"done,rewriteToken,resource({INFO_FIELDS})")
    )
    uri = transport.urls.uri(destination)
    headers = {"Content-Type": "application/json"}
    token: str | None = None
    while True:
        url = yarl.URL(
            base + ("" if token is None else "&rewriteToken=" + quote_name(token)),
            encoded=True,
        )

        async def attempt(url: yarl.URL = url) -> dict[str, Any]:
            _, _, resp = await transport.request(
                "POST", url, operation="copy", uri=uri, headers=headers, data=b"{}"
            )
            return _errors.parse_json(resp, operation="copy", uri=uri)

        # A repeated rewrite leaves the destination holding the source: safe.
        doc = await transport.call(attempt, "copy", uri)
        if doc.get("done"):
            return object_info(doc["resource"])
        token = doc.get("rewriteToken")
        if not token:
            raise StorageError(
                "rewrite answered neither done nor a token", operation="copy", uri=uri
            )
