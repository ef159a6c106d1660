"""The resumable upload protocol of the GCS store, over its transport.

A session is started once; chunks (multiples of 256 KiB but the last) are sent
one request each. A chunk whose answer was lost is not resent blindly: the retry
first asks the session how many bytes it holds and sends the rest, so a repeat
never duplicates or skips bytes, and a final chunk that had in fact completed
the upload is recognised by the object the session returns. A final chunk whose
answers were lost until the retry deadline is resolved by the object itself
(:func:`~torchbucket.storage.gcs._uncertain.written_anyway`).

Integrity: the request that finalizes an upload carries the whole object's
CRC32C (``x-goog-hash``), also when it is only known at the end of a stream, so
GCS refuses an object whose bytes were damaged on the way and nothing becomes
visible. Such a refusal ends the session; it is raised as
:class:`~torchbucket.errors.IntegrityError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import yarl

from torchbucket.errors import IntegrityError, RetryableError, StorageError
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import _errors, _uncertain
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import (
    crc32c_of,
    crc_b64,
    extend_crc,
    persisted,
    quote_name,
)

__all__ = ["put", "put_stream"]

logger = logging.getLogger(__name__)


async def _start(
    transport: GCSTransport,
    key: str,
    content_type: str | None,
    if_generation_match: int | None,
    crc32c: str | None,
    size: int | None,
) -> yarl.URL:
    uri = transport.urls.uri(key)
    query = "uploadType=resumable&name=" + quote_name(key)
    if if_generation_match is not None:
        query += f"&ifGenerationMatch={if_generation_match}"
    url = yarl.URL(f"{transport.urls.upload_base}?{query}", encoded=True)
    meta: dict[str, Any] = {
        "name": key,
        "contentType": content_type or "application/octet-stream",
    }
    if crc32c is not None:
        meta["crc32c"] = crc32c
    headers = {
        "Content-Type": "application/json; charset=UTF-8",
        "X-Upload-Content-Type": meta["contentType"],
    }
    if size is not None:
        headers["X-Upload-Content-Length"] = str(size)
    body = json.dumps(meta).encode()

    async def attempt() -> yarl.URL:
        # bucket_op: creating an object needs nothing but its bucket, so a 404 says that is missing.
        _, resp_headers, _ = await transport.request(
            "POST", url, operation="put", uri=uri, headers=headers, data=body, bucket_op=True
        )
        location = resp_headers.get("Location")
        if not location:
            raise StorageError("resumable upload got no session URL", operation="put", uri=uri)
        return yarl.URL(location, encoded=True)

    # Starting a session twice only leaves an unused session, which expires.
    return await transport.call(attempt, "put", uri)


async def _send(
    transport: GCSTransport,
    session_url: yarl.URL,
    chunk: bytes | memoryview,
    offset: int,
    total: int | None,
    uri: str,
    crc32c: str | None = None,
) -> tuple[ObjectInfo | None, int]:
    """Send ``chunk`` at ``offset``; ``total`` is set on the last one.

    The last one also carries ``crc32c``, the whole object's, in
    ``x-goog-hash``: GCS checks it against everything the session received
    and refuses to create the object on a mismatch (as the Google client
    libraries finalize: googleapis/java-storage#3450,
    googleapis/google-cloud-rust#5655).

    Returns the object when the upload is complete, and the number of bytes
    the session holds. A retry first asks the session how much it holds.

    Raises:
        IntegrityError: The store refused the object's bytes; the session is
            over, so this is not retried here.
    """
    size = "*" if total is None else str(total)
    lost = False
    refused: IntegrityError | None = None
    hash_header = {} if total is None or crc32c is None else {"x-goog-hash": f"crc32c={crc32c}"}

    async def attempt() -> tuple[ObjectInfo | None, int]:
        nonlocal lost, refused
        begin = offset
        try:
            if lost:
                done, begin = await _held(transport, session_url, uri, size, offset, len(chunk))
                if done is not None:
                    return done, offset + len(chunk)
            piece = chunk[begin - offset :]
            if len(piece):
                crange = f"bytes {begin}-{begin + len(piece) - 1}/{size}"
            else:
                crange = f"bytes */{size}"
            status, headers, body = await transport.upload_request(
                "PUT",
                session_url,
                operation="put",
                uri=uri,
                headers={"Content-Range": crange, **hash_header},
                data=piece,
                allow=(308,),
            )
        except IntegrityError as exc:
            refused = exc
            return None, -1
        except RetryableError:
            lost = True
            raise
        if status == 308:
            return None, persisted(headers)
        return _errors.parse_info(body, operation="put", uri=uri), offset + len(chunk)

    result = await transport.call(attempt, "put", uri)
    if refused is not None:
        raise refused
    return result


async def _held(
    transport: GCSTransport, session_url: yarl.URL, uri: str, size: str, offset: int, length: int
) -> tuple[ObjectInfo | None, int]:
    """After a lost answer, ask the session how much it holds of ``length`` bytes at ``offset``.

    Returns the object if the upload is complete, else ``None`` and the bytes held.
    """
    status, headers, body = await transport.request(
        "PUT",
        session_url,
        operation="put",
        uri=uri,
        headers={"Content-Range": f"bytes */{size}"},
        allow=(308,),
    )
    if status != 308:
        return _errors.parse_info(body, operation="put", uri=uri), offset + length
    begin = persisted(headers)
    if not offset <= begin <= offset + length:
        raise StorageError(
            f"upload session holds {begin} bytes, expected {offset} to {offset + length}",
            operation="put",
            uri=uri,
        )
    return None, begin


async def _cancel(transport: GCSTransport, session_url: yarl.URL, uri: str) -> None:
    try:
        await transport.request("DELETE", session_url, operation="put", uri=uri, allow=(499,))
    except StorageError:
        logger.debug("could not cancel the upload session of %s", uri, exc_info=True)


async def put(
    transport: GCSTransport,
    key: str,
    data: bytes | bytearray | memoryview,
    if_generation_match: int | None,
    content_type: str | None,
    chunk_size: int,
) -> ObjectInfo:
    """Upload ``data`` through a resumable session, ``chunk_size`` bytes a request."""
    uri = transport.urls.uri(key)
    view = memoryview(data).cast("B")
    total = len(view)
    crc = crc32c_of(view)
    session_url = await _start(transport, key, content_type, if_generation_match, crc, total)
    offset = 0
    while True:
        stop = min(offset + chunk_size, total)
        try:
            info, offset = await _send(
                transport,
                session_url,
                view[offset:stop],
                offset,
                total if stop == total else None,
                uri,
                crc,
            )
        except StorageError as exc:
            if stop < total:
                raise  # the object cannot exist before its last chunk
            info = await _uncertain.written_anyway(transport, exc, key, size=total, crc32c=crc)
        if info is not None:
            return _uncertain.check_written(info, total, crc, "put", uri)


async def put_stream(
    transport: GCSTransport,
    key: str,
    chunks: AsyncIterator[bytes],
    content_type: str | None,
    chunk_size: int,
) -> ObjectInfo:
    """Upload a stream of chunks; nothing becomes visible if the stream fails."""
    uri = transport.urls.uri(key)
    session_url = await _start(transport, key, content_type, None, None, None)
    crc = 0
    buf = bytearray()
    offset = 0
    try:
        async for chunk in chunks:
            chunk = bytes(chunk)
            crc = extend_crc(crc, chunk)
            buf += chunk
            while len(buf) > chunk_size:
                piece = bytes(buf[:chunk_size])
                _, held = await _send(transport, session_url, piece, offset, None, uri)
                del buf[: held - offset]
                offset = held
        while True:
            piece = bytes(buf)
            try:
                info, held = await _send(
                    transport, session_url, piece, offset, offset + len(piece), uri, crc_b64(crc)
                )
            except StorageError as exc:
                size = offset + len(piece)
                info = await _uncertain.written_anyway(
                    transport, exc, key, size=size, crc32c=crc_b64(crc)
                )
                held = size
            if info is not None:
                break
            del buf[: held - offset]
            offset = held
    except (Exception, asyncio.CancelledError):
        await asyncio.shield(_cancel(transport, session_url, uri))
        raise
    return _uncertain.check_written(info, offset + len(buf), crc_b64(crc), "put", uri)
