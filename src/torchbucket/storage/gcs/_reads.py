"""Verified reads of GCS objects: into bytes, into a caller's buffer, as a stream.

Each read takes the store's :class:`~torchbucket.storage.gcs._transport.GCSTransport`.
A whole object's CRC32C is checked against the ``x-goog-hash`` it was served
with; a range is checked against what was asked for (its ``Content-Range``).
Large ranges into a buffer go through the transport's in-place reader
(:mod:`._rawget`); a stream that breaks resumes where it stopped, pinned to the
generation it started on. Objects stored gzip-encoded are read as stored and
decoded here (:mod:`._gzip`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import yarl

from torchbucket.errors import IntegrityError, StorageError
from torchbucket.runtime import accounting
from torchbucket.storage.gcs import _errors, _gzip, _head, _rawget
from torchbucket.storage.gcs._resume import ResumingStream
from torchbucket.storage.gcs._transport import TRANSPORT_ERRORS, GCSTransport
from torchbucket.storage.gcs._wire import (
    check_span,
    content_range,
    crc_b64,
    extend_crc,
    range_header,
    verify_crc32c,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = ["read", "read_into", "stream"]

logger = logging.getLogger(__name__)


async def read(
    transport: GCSTransport, url: yarl.URL, key: str, start: int, end: int | None
) -> bytes:
    """GET ``url`` (``alt=media``), the range ``[start, end)``, verified."""
    uri = transport.urls.uri(key)
    headers = range_header(start, end)

    async def attempt() -> bytes:
        status, resp_headers, body = await transport.request(
            "GET", url, operation="get", uri=uri, headers=headers, allow=(416,)
        )
        if status == 416:
            if start and await _transcoded(transport, key):
                return (await _gzip.read_decoded(transport, url, uri))[start:end]
            return b""
        if _gzip.served_gzip(resp_headers):
            # The stored gzip bytes (see _gzip): decoded offsets need all of them.
            span = content_range(resp_headers)
            if status == 206 and not (span and span[0] == 0 and span[2] == len(body)):
                return (await _gzip.read_decoded(transport, url, uri))[start:end]
            decoded = _gzip.decode_answer(resp_headers, body, uri)
            return decoded if headers is None else decoded[start:end]
        if status == 206:
            span = content_range(resp_headers)
            if span is not None:
                first, last, total = span
                if len(body) != last - first + 1 or first != start:
                    raise IntegrityError(
                        f"asked for bytes from {start}, got {len(body)} bytes for {first}-{last}",
                        operation="get",
                        uri=uri,
                    )
                if first == 0 and total == len(body):
                    verify_crc32c(resp_headers, crc_b64(extend_crc(0, body)), uri)
            return body
        verify_crc32c(resp_headers, crc_b64(extend_crc(0, body)), uri)
        if headers is not None:  # the server ignored the Range header
            return body[start:end]
        return body

    hedger = transport.hedger
    if hedger is None:
        return await transport.call(attempt, "get", uri)
    nbytes = None if end is None else end - start

    def hedged() -> Awaitable[bytes]:
        return hedger.run(attempt, attempt, _same, nbytes)

    return await transport.call(hedged, "get", uri)


def _same(data: bytes) -> bytes:
    return data


async def read_into(
    transport: GCSTransport, url: yarl.URL, key: str, start: int, buffer: memoryview
) -> int:
    """GET ``[start, start + len(buffer))`` of ``url`` straight into ``buffer``.

    Ranges of at least :data:`~torchbucket.storage.gcs._rawget.MIN_BYTES`
    go through :class:`~torchbucket.storage.gcs._rawget.RawGetter`, which
    receives the body in place; an answer it does not read is asked for
    again through aiohttp.
    """
    uri = transport.urls.uri(key)
    size = len(buffer)
    headers = {"Range": f"bytes={start}-{start + size - 1}"}
    raw = transport.raw_ok and size >= _rawget.MIN_BYTES

    async def attempt(into: memoryview) -> int:
        session = transport.loop_state()[1]
        hdrs = await transport.headers(headers, "get", uri)
        if raw:
            got = await transport.raw_getter().read_into(
                url,
                hdrs or headers,
                into,
                start,
                uri=uri,
                connect_timeout=transport.connect_timeout,
                read_timeout=transport.read_timeout,
            )
            if got is not None:
                return got
        accounting.count("get")
        try:
            async with session.get(url, headers=hdrs, **transport.streaming_kw) as resp:
                if resp.status == 416:
                    if start and await _transcoded(transport, key):
                        return await _decoded_into(transport, url, uri, start, into)
                    return 0
                if resp.status < 300 and _gzip.served_gzip(resp.headers):
                    # Stored gzip bytes (see _gzip): decoded offsets need all of them.
                    resp.release()
                    return await _decoded_into(transport, url, uri, start, into)
                if resp.status >= 300:
                    body = await resp.read()
                    raise _errors.error_for_response(
                        resp.status, resp.headers, body, operation="get", uri=uri
                    )
                if resp.status == 200:  # Range ignored: take our slice of the whole
                    whole = await resp.read()
                    accounting.received(len(whole))
                    verify_crc32c(resp.headers, crc_b64(extend_crc(0, whole)), uri)
                    piece = whole[start : start + size]
                    into[: len(piece)] = piece
                    return len(piece)
                return await _receive_range(resp, into, start, uri)
        except StorageError:
            raise  # NotFoundError is an OSError too: keep it as it is
        except TRANSPORT_ERRORS as exc:
            raise transport.transport_error(exc, "get", uri) from exc

    hedger = transport.hedger
    if hedger is None:
        return await transport.call(functools.partial(attempt, buffer), "get", uri)

    async def spare() -> tuple[int, bytearray]:
        # Its own buffer: the first request may still be writing into the caller's.
        into = bytearray(size)
        return await attempt(memoryview(into)), into

    def adopt(answer: tuple[int, bytearray]) -> int:
        got, into = answer
        buffer[:got] = memoryview(into)[:got]
        return got

    def hedged() -> Awaitable[int]:
        return hedger.run(functools.partial(attempt, buffer), spare, adopt, size)

    return await transport.call(hedged, "get", uri)


async def _receive_range(
    resp: aiohttp.ClientResponse, into: memoryview, start: int, uri: str
) -> int:
    """The body of a 206 answer to ``[start, start + len(into))``, straight into ``into``."""
    size = len(into)
    span = content_range(resp.headers)
    # Only a range that is the whole object can be checked against
    # the object's CRC32C; the CRC of any other range is wasted work
    # (callers such as checkpoint loads check the whole object once).
    whole_object = span is not None and span[0] == 0 and span[2] == span[1] + 1
    crc = 0
    pos = 0
    async for chunk in resp.content.iter_any():
        n = len(chunk)
        if pos + n > size:
            raise IntegrityError(
                f"server sent more than the {size} bytes asked for",
                operation="get",
                uri=uri,
            )
        into[pos : pos + n] = chunk
        if whole_object:
            crc = extend_crc(crc, chunk)
        pos += n
    accounting.received(pos)
    if span is not None and check_span(span, start, pos, uri):
        verify_crc32c(resp.headers, crc_b64(crc), uri)
    return pos


async def _transcoded(transport: GCSTransport, key: str) -> bool:
    """Whether ``key`` is served decoded (after a 416: its decoded bytes may go on)."""
    info = await _head.head_once(transport, key, "get")
    return info is not None and info.transcoded


async def _decoded_into(
    transport: GCSTransport, url: yarl.URL, uri: str, start: int, buffer: memoryview
) -> int:
    piece = (await _gzip.read_decoded(transport, url, uri))[start : start + len(buffer)]
    buffer[: len(piece)] = piece
    return len(piece)


async def stream(
    transport: GCSTransport,
    url_for: Callable[[int | None], yarl.URL],
    key: str,
    start: int,
    end: int | None,
    chunk_size: int,
) -> AsyncIterator[bytes]:
    """Yield ``[start, end)`` of an object; a broken read resumes where it stopped.

    A resumed read is pinned to the generation the first response named, so
    the chunks never mix two versions of the object.
    """
    uri = transport.urls.uri(key)
    reader = ResumingStream(transport, url_for, uri, start, end, allow=(416,))
    first = await reader.open()
    # Past the stored end, a gzip object's decoded bytes may go on (as in read).
    past_gzip_end = first.status == 416 and start > 0 and await _transcoded(transport, key)
    if past_gzip_end or _gzip.served_gzip(first.headers):
        # Stored gzip bytes: streamed decoded, from the stored offset 0 (_gzip).
        generation = None if past_gzip_end else first.headers.get("x-goog-generation")
        # Dropped unread, but sent (and billed): counted as the server counts it.
        accounting.received(first.content_length or 0)
        first.release()
        async for piece in _gzip.stream_decoded(
            transport, url_for, key, start, end, chunk_size, int(generation) if generation else None
        ):
            yield piece
        return
    crc: int | None = 0 if start == 0 and end is None else None
    async with contextlib.aclosing(reader.chunks(chunk_size, first)) as chunks:
        async for chunk in chunks:
            if crc is not None:
                crc = extend_crc(crc, chunk)
            yield chunk
    if crc is not None and reader.hash_headers is not None:
        verify_crc32c(reader.hash_headers, crc_b64(crc), uri)
