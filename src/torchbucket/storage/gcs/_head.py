"""An object's metadata (``objects.get``): the store's ``head``, and the checks of a write.

:func:`head` retries on its own; :func:`head_once` is one request, for code
that already runs inside an attempt (an uncertain write resolved by the object
itself, a read that asks whether an object is served decoded).
"""

from __future__ import annotations

from torchbucket.errors import NotFoundError
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import _errors
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, quote_name

__all__ = ["head", "head_once", "head_or_none"]

_QUERY = "fields=" + quote_name(INFO_FIELDS)


async def head(transport: GCSTransport, key: str) -> ObjectInfo:
    """Metadata of one object, with retries.

    Raises:
        NotFoundError: No such object.
    """
    url = transport.urls.object_url(key, _QUERY)
    uri = transport.urls.uri(key)

    async def attempt() -> ObjectInfo:
        _, _, body = await transport.request("GET", url, operation="head", uri=uri)
        return _errors.parse_info(body, operation="head", uri=uri)

    return await transport.call(attempt, "head", uri)


async def head_or_none(transport: GCSTransport, key: str) -> ObjectInfo | None:
    """:func:`head`, ``None`` for no such object."""
    try:
        return await head(transport, key)
    except NotFoundError:
        return None


async def head_once(transport: GCSTransport, key: str, operation: str) -> ObjectInfo | None:
    """One metadata request, no retries of its own (it runs inside an attempt)."""
    uri = transport.urls.uri(key)
    url = transport.urls.object_url(key, _QUERY)
    status, _, body = await transport.request(
        "GET", url, operation=operation, uri=uri, allow=(404,)
    )
    if status == 404:
        return None
    return _errors.parse_info(body, operation=operation, uri=uri)
