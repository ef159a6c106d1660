"""Requests and byte transfer for :class:`~torchbucket.storage.gcs.GCSStore`.

:class:`GCSTransport` holds what every request needs (the session of the running
loop, the limiter, the credentials) and the transfers that are more than one
request: verified reads into bytes, into a caller's buffer and as a stream that
resumes where it broke, and resumable uploads chunk by chunk.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import google_crc32c
import yarl
from multidict import CIMultiDictProxy

from torchbucket import retry
from torchbucket.config import ConcurrencyConfig, RetryConfig
from torchbucket.errors import (
    IntegrityError,
    RetryableError,
    StorageError,
    TransientError,
)
from torchbucket.storage import _gcs_http as _http
from torchbucket.storage.base import ObjectInfo

__all__ = ["GCSTransport", "object_info"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_Response = tuple[int, "CIMultiDictProxy[str]", bytes]
_MAX_STREAM_RESUMES = 10
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def object_info(doc: Mapping[str, Any]) -> ObjectInfo:
    """An :class:`ObjectInfo` from a JSON API object resource."""
    generation = doc.get("generation")
    return ObjectInfo(
        name=doc["name"],
        size=int(doc.get("size", 0)),
        generation=int(generation) if generation is not None else None,
        crc32c=doc.get("crc32c"),
        storage_class=doc.get("storageClass"),
    )


_extend: Callable[[int, bytes], int] = google_crc32c.extend


def _crc_b64(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def _hash_header_crc32c(headers: Mapping[str, str]) -> str | None:
    values: list[str] = (
        headers.getall("x-goog-hash", [])  # type: ignore[attr-defined]
        if hasattr(headers, "getall")
        else [headers.get("x-goog-hash", "")]
    )
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part.startswith("crc32c="):
                return part[7:]
    return None


def _content_range(headers: Mapping[str, str]) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of ``Content-Range: bytes first-last/total``."""
    value = headers.get("Content-Range")
    if not value or not value.startswith("bytes "):
        return None
    span, _, total = value[6:].partition("/")
    first, _, last = span.partition("-")
    try:
        return int(first), int(last), (int(total) if total and total != "*" else None)
    except ValueError:
        return None


def _range_header(start: int, end: int | None) -> dict[str, str] | None:
    if start == 0 and end is None:
        return None
    return {"Range": f"bytes={start}-{'' if end is None else end - 1}"}


def _persisted(headers: Mapping[str, str]) -> int:
    """Bytes a resumable session holds, from the ``Range: bytes=0-N`` of a 308."""
    value = headers.get("Range")
    if not value:
        return 0
    _, _, last = value.partition("-")
    return int(last) + 1


def _stream_end(end: int | None, total: int | None) -> int | None:
    """Where a stream of ``[..., end)`` of an object of ``total`` bytes stops."""
    if total is None:
        return end
    return total if end is None else min(end, total)


class GCSTransport:
    """Sessions, limiter, credentials and multi-request transfers of one bucket."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str,
        credentials: _http.Credentials,
        retry_config: RetryConfig,
        concurrency: ConcurrencyConfig,
        session_key: _http.SessionKey,
    ) -> None:
        self._bucket = bucket
        self._endpoint = endpoint
        self._credentials = credentials
        self._retry_config = retry_config
        self._concurrency = concurrency
        self._session_key = session_key
        self._state: (
            tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession, retry.AdaptiveLimiter] | None
        ) = None
        self._uri_prefix = f"gs://{bucket}/"

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket

    @property
    def endpoint(self) -> str:
        """The base URL requests go to."""
        return self._endpoint

    def uri(self, key: str = "") -> str:
        """``gs://bucket/key``."""
        return self._uri_prefix + key

    # ------------------------------------------------------------ one request

    def _loop_state(
        self,
    ) -> tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession, retry.AdaptiveLimiter]:
        loop = asyncio.get_running_loop()
        state = self._state
        if state is None or state[0] is not loop or state[1].closed:
            state = self._state = (
                loop,
                _http.get_session(self._session_key),
                retry.get_limiter(self._endpoint, self._concurrency),
            )
        return state

    async def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        operation: str,
        uri: str,
        *,
        idempotent: bool = True,
    ) -> T:
        """Run ``attempt`` with retries under the endpoint's limiter."""
        return await retry.call(
            attempt,
            config=self._retry_config,
            operation=operation,
            uri=uri,
            idempotent=idempotent,
            limiter=self._loop_state()[2],
        )

    async def _headers(self, extra: Mapping[str, str] | None) -> Mapping[str, str] | None:
        auth = await self._credentials.headers()
        if not extra:
            return auth or None
        return {**auth, **extra} if auth else extra

    async def request(
        self,
        method: str,
        url: yarl.URL,
        *,
        operation: str,
        uri: str,
        headers: Mapping[str, str] | None = None,
        data: Any = None,
        bucket_op: bool = False,
        allow: tuple[int, ...] = (),
    ) -> _Response:
        """Send one request and read its whole answer.

        Raises:
            StorageError: The mapped error for a status >= 300 not in ``allow``,
                or for a transport failure.
        """
        session = self._loop_state()[1]
        hdrs = await self._headers(headers)
        try:
            async with session.request(method, url, headers=hdrs, data=data) as resp:
                body = await resp.read()
                status = resp.status
                resp_headers = resp.headers
        except _TRANSPORT_ERRORS as exc:
            raise self._transport_error(exc, operation, uri) from exc
        if status >= 300 and status not in allow:
            raise _http.error_for_response(
                status, resp_headers, body, operation=operation, uri=uri, bucket_op=bucket_op
            )
        return status, resp_headers, body

    @staticmethod
    def _transport_error(exc: BaseException, operation: str, uri: str) -> StorageError:
        error = _http.error_for_exception(exc, operation=operation, uri=uri)
        return error or TransientError(
            f"request failed ({type(exc).__name__})", operation=operation, uri=uri
        )

    async def close_session(self) -> None:
        """Close this loop's session for the store's settings (others may reopen it)."""
        state = self._state
        self._state = None
        if state is not None and state[0] is asyncio.get_running_loop():
            await state[1].close()

    # ------------------------------------------------------------ reads

    def _verify_whole(self, headers: Mapping[str, str], checksum: str, uri: str) -> None:
        expected = _hash_header_crc32c(headers)
        if expected is not None and expected != checksum:
            raise IntegrityError(
                f"CRC32C mismatch: server says {expected}, received bytes give {checksum}",
                operation="get",
                uri=uri,
            )

    async def read_object(self, url: yarl.URL, key: str, start: int, end: int | None) -> bytes:
        """GET ``url`` (``alt=media``), the range ``[start, end)``, verified."""
        uri = self.uri(key)
        headers = _range_header(start, end)

        async def attempt() -> bytes:
            status, resp_headers, body = await self.request(
                "GET", url, operation="get", uri=uri, headers=headers, allow=(416,)
            )
            if status == 416:
                return b""
            if status == 206:
                span = _content_range(resp_headers)
                if span is not None:
                    first, last, total = span
                    if len(body) != last - first + 1 or first != start:
                        raise IntegrityError(
                            f"asked for bytes from {start}, got {len(body)} bytes "
                            f"for {first}-{last}",
                            operation="get",
                            uri=uri,
                        )
                    if first == 0 and total == len(body):
                        self._verify_whole(resp_headers, _crc_b64(_extend(0, body)), uri)
                return body
            self._verify_whole(resp_headers, _crc_b64(_extend(0, body)), uri)
            if headers is not None:  # the server ignored the Range header
                return body[start:end]
            return body

        return await self.call(attempt, "get", uri)

    async def read_object_into(
        self, url: yarl.URL, key: str, start: int, buffer: memoryview
    ) -> int:
        """GET ``[start, start + len(buffer))`` of ``url`` straight into ``buffer``."""
        uri = self.uri(key)
        size = len(buffer)
        headers = {"Range": f"bytes={start}-{start + size - 1}"}

        async def attempt() -> int:
            session = self._loop_state()[1]
            hdrs = await self._headers(headers)
            try:
                async with session.get(url, headers=hdrs) as resp:
                    if resp.status == 416:
                        return 0
                    if resp.status >= 300:
                        body = await resp.read()
                        raise _http.error_for_response(
                            resp.status, resp.headers, body, operation="get", uri=uri
                        )
                    if resp.status == 200:  # Range ignored: take our slice of the whole
                        whole = await resp.read()
                        self._verify_whole(resp.headers, _crc_b64(_extend(0, whole)), uri)
                        piece = whole[start : start + size]
                        buffer[: len(piece)] = piece
                        return len(piece)
                    span = _content_range(resp.headers)
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
                        buffer[pos : pos + n] = chunk
                        crc = _extend(crc, chunk)
                        pos += n
                    if span is not None:
                        first, last, total = span
                        if first != start or pos != last - first + 1:
                            raise IntegrityError(
                                f"expected bytes {first}-{last}, received {pos}",
                                operation="get",
                                uri=uri,
                            )
                        if first == 0 and total == pos:
                            self._verify_whole(resp.headers, _crc_b64(crc), uri)
                    return pos
            except StorageError:
                raise  # NotFoundError is an OSError too: keep it as it is
            except _TRANSPORT_ERRORS as exc:
                raise self._transport_error(exc, "get", uri) from exc

        return await self.call(attempt, "get", uri)

    async def stream_object(
        self,
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
        uri = self.uri(key)
        pos = start
        generation: int | None = None
        total: int | None = None
        crc: int | None = 0 if start == 0 and end is None else None
        resumes = 0
        while True:
            url = url_for(generation)
            headers = _range_header(pos, end)

            async def open_response(
                url: yarl.URL = url, headers: Mapping[str, str] | None = headers
            ) -> aiohttp.ClientResponse:
                session = self._loop_state()[1]
                hdrs = await self._headers(headers)
                try:
                    resp = await session.get(url, headers=hdrs)
                    if resp.status >= 300 and resp.status != 416:
                        body = await resp.read()
                        resp.release()
                        raise _http.error_for_response(
                            resp.status, resp.headers, body, operation="stream", uri=uri
                        )
                    return resp
                except StorageError:
                    raise  # NotFoundError is an OSError too: keep it as it is
                except _TRANSPORT_ERRORS as exc:
                    raise self._transport_error(exc, "stream", uri) from exc

            resp = await self.call(open_response, "stream", uri)
            broken: BaseException | None = None
            try:
                if resp.status == 416:
                    return
                if generation is None and resp.headers.get("x-goog-generation"):
                    generation = int(resp.headers["x-goog-generation"])
                span = _content_range(resp.headers)
                if span is not None and span[2] is not None:
                    total = span[2]
                elif resp.status == 200 and resp.content_length is not None:
                    total = resp.content_length
                if resp.status == 206 and span is not None and span[0] != pos:
                    raise IntegrityError(
                        f"asked for bytes from {pos}, got them from {span[0]}",
                        operation="stream",
                        uri=uri,
                    )
                skip = pos if resp.status == 200 else 0  # the server ignored Range
                try:
                    async for chunk in resp.content.iter_chunked(chunk_size):
                        if skip:
                            cut = min(skip, len(chunk))
                            chunk, skip = chunk[cut:], skip - cut
                        if end is not None and pos + len(chunk) > end:
                            chunk = chunk[: end - pos]
                        if not chunk:
                            continue
                        pos += len(chunk)
                        if crc is not None:
                            crc = _extend(crc, chunk)
                        yield chunk
                        if end is not None and pos >= end:
                            break
                except _TRANSPORT_ERRORS as exc:
                    broken = exc
            finally:
                resp.release()
            stop = _stream_end(end, total)
            if broken is None and (stop is None or pos >= stop):
                break
            resumes += 1
            if resumes > _MAX_STREAM_RESUMES:
                if broken is not None:
                    raise self._transport_error(broken, "stream", uri) from broken
                raise IntegrityError(
                    f"stream ended at byte {pos}, expected {stop}", operation="stream", uri=uri
                )
            logger.debug("stream of %s broke at byte %d; resuming", uri, pos)
        if crc is not None:
            self._verify_whole(resp.headers, _crc_b64(crc), uri)

    # ------------------------------------------------------------ resumable uploads

    async def _resumable_start(
        self,
        upload_base: str,
        key: str,
        content_type: str | None,
        if_generation_match: int | None,
        crc32c: str | None,
        size: int | None,
    ) -> yarl.URL:
        uri = self.uri(key)
        query = "uploadType=resumable&name=" + quote(key, safe="")
        if if_generation_match is not None:
            query += f"&ifGenerationMatch={if_generation_match}"
        url = yarl.URL(f"{upload_base}?{query}", encoded=True)
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
            _, resp_headers, _ = await self.request(
                "POST", url, operation="put", uri=uri, headers=headers, data=body
            )
            location = resp_headers.get("Location")
            if not location:
                raise StorageError("resumable upload got no session URL", operation="put", uri=uri)
            return yarl.URL(location, encoded=True)

        # Starting a session twice only leaves an unused session, which expires.
        return await self.call(attempt, "put", uri)

    async def _resumable_send(
        self,
        session_url: yarl.URL,
        chunk: bytes | memoryview,
        offset: int,
        total: int | None,
        uri: str,
    ) -> tuple[ObjectInfo | None, int]:
        """Send ``chunk`` at ``offset``; ``total`` is set on the last one.

        Returns the object when the upload is complete, and the number of bytes
        the session holds. A retry first asks the session how much it holds.
        """
        size = "*" if total is None else str(total)
        lost = False

        async def attempt() -> tuple[ObjectInfo | None, int]:
            nonlocal lost
            begin = offset
            try:
                if lost:
                    status, headers, body = await self.request(
                        "PUT",
                        session_url,
                        operation="put",
                        uri=uri,
                        headers={"Content-Range": f"bytes */{size}"},
                        allow=(308,),
                    )
                    if status != 308:
                        return object_info(json.loads(body)), offset + len(chunk)
                    begin = _persisted(headers)
                    if not offset <= begin <= offset + len(chunk):
                        raise StorageError(
                            f"upload session holds {begin} bytes, expected {offset} to "
                            f"{offset + len(chunk)}",
                            operation="put",
                            uri=uri,
                        )
                piece = chunk[begin - offset :]
                if len(piece):
                    crange = f"bytes {begin}-{begin + len(piece) - 1}/{size}"
                else:
                    crange = f"bytes */{size}"
                status, headers, body = await self.request(
                    "PUT",
                    session_url,
                    operation="put",
                    uri=uri,
                    headers={"Content-Range": crange},
                    data=piece,
                    allow=(308,),
                )
            except RetryableError:
                lost = True
                raise
            if status == 308:
                return None, _persisted(headers)
            return object_info(json.loads(body)), offset + len(chunk)

        return await self.call(attempt, "put", uri)

    async def _resumable_cancel(self, session_url: yarl.URL, uri: str) -> None:
        try:
            await self.request("DELETE", session_url, operation="put", uri=uri, allow=(499,))
        except StorageError:
            logger.debug("could not cancel the upload session of %s", uri, exc_info=True)

    def check_written(
        self, info: ObjectInfo, size: int, crc32c: str | None, operation: str, uri: str
    ) -> ObjectInfo:
        """Raise ``IntegrityError`` if the server stored other bytes than we sent."""
        if info.size != size or (crc32c and info.crc32c and info.crc32c != crc32c):
            raise IntegrityError(
                f"stored {info.size} bytes with CRC32C {info.crc32c}, sent {size} with {crc32c}",
                operation=operation,
                uri=uri,
            )
        return info

    async def resumable_put(
        self,
        upload_base: str,
        key: str,
        data: bytes | bytearray | memoryview,
        if_generation_match: int | None,
        content_type: str | None,
        chunk_size: int,
    ) -> ObjectInfo:
        """Upload ``data`` through a resumable session, ``chunk_size`` bytes a request."""
        uri = self.uri(key)
        view = memoryview(data).cast("B")
        crc = _crc_b64(_extend(0, bytes(view)))
        total = len(view)
        session_url = await self._resumable_start(
            upload_base, key, content_type, if_generation_match, crc, total
        )
        offset = 0
        while True:
            stop = min(offset + chunk_size, total)
            info, offset = await self._resumable_send(
                session_url, view[offset:stop], offset, total if stop == total else None, uri
            )
            if info is not None:
                return self.check_written(info, total, crc, "put", uri)

    async def resumable_put_stream(
        self,
        upload_base: str,
        key: str,
        chunks: AsyncIterator[bytes],
        content_type: str | None,
        chunk_size: int,
    ) -> ObjectInfo:
        """Upload a stream of chunks; nothing becomes visible if the stream fails."""
        uri = self.uri(key)
        session_url = await self._resumable_start(upload_base, key, content_type, None, None, None)
        crc = 0
        buf = bytearray()
        offset = 0
        try:
            async for chunk in chunks:
                chunk = bytes(chunk)
                crc = _extend(crc, chunk)
                buf += chunk
                while len(buf) > chunk_size:
                    piece = bytes(buf[:chunk_size])
                    _, held = await self._resumable_send(session_url, piece, offset, None, uri)
                    del buf[: held - offset]
                    offset = held
            while True:
                piece = bytes(buf)
                info, held = await self._resumable_send(
                    session_url, piece, offset, offset + len(piece), uri
                )
                if info is not None:
                    break
                del buf[: held - offset]
                offset = held
        except (Exception, asyncio.CancelledError):
            await asyncio.shield(self._resumable_cancel(session_url, uri))
            raise
        return self.check_written(info, offset + len(buf), _crc_b64(crc), "put", uri)
