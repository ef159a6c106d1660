"""Requests and reads for :class:`~torchbucket.storage.gcs.GCSStore`.

:class:`GCSTransport` holds what every request needs (the session of the running
loop, the limiter, the credentials), sends one request with the one error
mapping, and performs the reads that are more than one request: verified reads
into bytes, into a caller's buffer, and as a stream that resumes where it broke.

It also owns the one answer to a write whose outcome is uncertain (the request
failed without a definite answer: a server error, a reset, a timeout, a garbled
answer): such a write may have taken effect. :meth:`GCSTransport.write` retries
it safely and :meth:`GCSTransport.written_anyway` recognises it by the object
itself, which holds exactly what was sent (size and CRC32C) if it did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import yarl
from multidict import CIMultiDictProxy

from torchbucket import _watchdog, accounting, retry
from torchbucket.config import ConcurrencyConfig, RetryConfig
from torchbucket.errors import (
    DeadlineExceededError,
    IntegrityError,
    NotFoundError,
    PreconditionFailedError,
    RetryableError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.storage import _gcs_gzip as _gzip
from torchbucket.storage import _gcs_http as _http
from torchbucket.storage import _gcs_rawget as _rawget
from torchbucket.storage._gcs_wire import (
    INFO_FIELDS,
    check_span,
    content_range,
    crc_b64,
    extend_crc,
    quote_name,
    range_header,
    stream_end,
    verify_crc32c,
)
from torchbucket.storage.base import ObjectInfo

__all__ = ["GCSTransport"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_Response = tuple[int, "CIMultiDictProxy[str]", bytes]
_MAX_STREAM_RESUMES = 10
_LoopState = tuple[
    asyncio.AbstractEventLoop, aiohttp.ClientSession, retry.AdaptiveLimiter, _watchdog.Watchdog
]
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_HEAD_QUERY = "fields=" + quote_name(INFO_FIELDS)


def _sent_size(data: Any) -> int:
    """Body bytes of a request's ``data`` (0 for none, or a body of unknown size)."""
    if data is None:
        return 0
    try:
        return len(data)
    except TypeError:
        return 0


def uncertain(exc: BaseException) -> bool:
    """Whether a write that failed with ``exc`` may nevertheless have taken effect.

    Everything that is not a definite answer: a server error, a reset, a
    timeout (a cancelled attempt), a garbled answer, retries that ran out. A 429
    is a definite refusal: the service did not act on the request.
    """
    if isinstance(exc, ThrottledError) and exc.status == 429:
        return False
    return isinstance(exc, (RetryableError, DeadlineExceededError, asyncio.CancelledError))


#: What GCS answers when the bytes it received do not match the checksum the
#: client declared: a 400 whose XML code is one of these
#: (googleapis/python-storage#1529), or, on the JSON API, reason ``invalid``
#: with ``Provided CRC32C "..." doesn't match calculated CRC32C "..."`` (or the
#: same for ``MD5 hash``), as quoted in googleapis/python-storage#1541 and
#: googleapis/google-cloud-java#267. The JSON API gives no other sign of it.
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "CrcMismatch"})
_DIGEST_MESSAGES = ("Provided CRC32C ", "Provided MD5 hash ")


def refused_checksum(reason: str, message: str) -> bool:
    """Whether a 400's error document says the received bytes failed their checksum."""
    return reason in _DIGEST_CODES or (reason == "invalid" and message.startswith(_DIGEST_MESSAGES))


def holds(info: ObjectInfo | None, size: int, crc32c: str | None) -> bool:
    """Whether the object ``info`` describes holds exactly ``size`` bytes with ``crc32c``.

    Without a CRC32C to compare (``crc32c`` or the object's is ``None``) the size
    alone decides.
    """
    if info is None or info.size != size:
        return False
    return crc32c is None or info.crc32c is None or info.crc32c == crc32c


class GCSTransport:
    """Sessions, limiter, credentials, one request, and verified reads of one bucket."""

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
        self._read_timeout = session_key.read_timeout
        # For bodies read chunk by chunk, and uploads: aiohttp's read timeout,
        # which starts once the request is sent and rescheduled on every chunk.
        self._streaming_kw: dict[str, Any] = {
            "timeout": aiohttp.ClientTimeout(
                total=None,
                sock_read=session_key.read_timeout,
                sock_connect=session_key.connect_timeout,
            )
        }
        self._upload_kw: dict[str, Any] = {
            **self._streaming_kw,
            # No Content-Type but the one given: aiohttp's would be octet-stream.
            "skip_auto_headers": ("Content-Type",),
        }
        self._state: _LoopState | None = None
        self._raw_ok = _rawget.supported(endpoint)
        self._raw: _rawget.RawGetter | None = None
        self._uri_prefix = f"gs://{bucket}/"
        b = quote_name(bucket)
        self._json_base = f"{endpoint}/storage/v1/b/{b}"
        self._object_base = f"{endpoint}/storage/v1/b/{b}/o/"
        self._upload_base = f"{endpoint}/upload/storage/v1/b/{b}/o"
        self._xml_base = f"{endpoint}/{b}"
        parsed = yarl.URL(endpoint)
        self._url_scheme = parsed.scheme
        self._url_authority = parsed.raw_authority
        self._object_path = f"{parsed.raw_path.rstrip('/')}/storage/v1/b/{b}/o/"

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

    def _object_url(self, key: str, query: str = "") -> yarl.URL:
        # URL.build from parts costs a third of parsing a whole URL string.
        return yarl.URL.build(
            scheme=self._url_scheme,
            authority=self._url_authority,
            path=self._object_path + quote_name(key),
            query_string=query,
            encoded=True,
        )

    # ------------------------------------------------------------ one request

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._state
        if state is None or state[0] is not loop or state[1].closed:
            state = self._state = (
                loop,
                _http.acquire_session(self._session_key),
                retry.get_limiter(self._endpoint, self._concurrency),
                _watchdog.watchdog(loop),
            )
        return state

    def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        operation: str,
        uri: str,
        *,
        idempotent: bool = True,
    ) -> Awaitable[T]:
        """Run ``attempt`` with retries under the endpoint's limiter (await the result).

        With credentials, an attempt answered 401 is sent once more with a new
        token (:meth:`~torchbucket.storage._gcs_http.Credentials.reauthorizing`).
        """
        if not self._credentials.anonymous:
            attempt = self._credentials.reauthorizing(attempt)
        # retry.call's coroutine itself, not one more coroutine around it.
        return retry.call(
            attempt,
            config=self._retry_config,
            operation=operation,
            uri=uri,
            idempotent=idempotent,
            limiter=self._loop_state()[2],
        )

    async def delete_request(
        self, url: yarl.URL, operation: str, uri: str, *, idempotent: bool = True
    ) -> None:
        """Send a DELETE with retries; a 404 after a lost answer means it was done.

        Raises:
            NotFoundError: The first attempt found nothing to delete.
        """
        ambiguous = False

        async def attempt() -> None:
            nonlocal ambiguous
            try:
                await self.request("DELETE", url, operation=operation, uri=uri)
            except NotFoundError:
                if not ambiguous:
                    raise
                # A retry of a delete whose answer was lost: that one deleted it.
            except RetryableError:
                ambiguous = True
                raise

        await self.call(attempt, operation, uri, idempotent=idempotent)

    async def _headers(
        self, extra: Mapping[str, str] | None, operation: str, uri: str
    ) -> Mapping[str, str] | None:
        # Without a token to refresh (anonymous, or still valid) no coroutine.
        auth = self._credentials.ready_headers()
        if auth is None:
            auth = await self._credentials.headers(operation, uri)
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
        _, session, _, dog = self._loop_state()
        hdrs = await self._headers(headers, operation, uri)
        accounting.count(
            accounting.classify(method, url.raw_path, url.query_string), _sent_size(data)
        )
        if data is not None:
            # An upload: aiohttp's read timeout, which starts once it is sent.
            try:
                async with session.request(
                    method, url, headers=hdrs, data=data, **self._upload_kw
                ) as resp:
                    body = await resp.read()
                    status = resp.status
                    resp_headers = resp.headers
            except _TRANSPORT_ERRORS as exc:
                raise self._transport_error(exc, operation, uri) from exc
        else:
            # The loop's watchdog cuts the request short after read_timeout
            # without a byte (headers included): no timer per request or chunk.
            # Unlike aiohttp's sock_read the silence counts from the start, a
            # wait for a pooled connection included (the limiter keeps the
            # requests in flight within the pool's size).
            response: aiohttp.ClientResponse | None = None
            watch = dog.start(
                quiet=self._read_timeout,
                progress=lambda: -1 if response is None else response.content.total_bytes,
            )
            try:
                async with session.request(method, url, headers=hdrs) as response:
                    body = await response.read()
                    status = response.status
                    resp_headers = response.headers
            except _TRANSPORT_ERRORS as exc:
                raise self._transport_error(exc, operation, uri) from exc
            except asyncio.CancelledError:
                if dog.stop(watch):
                    raise TransientError(
                        f"no data from the server for {self._read_timeout:g} s (read timeout)",
                        operation=operation,
                        uri=uri,
                    ) from None
                raise
            finally:
                dog.stop(watch)
        accounting.received(len(body))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s %s: %s -> HTTP %d, %d bytes", operation, uri, method, status, len(body)
            )
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

    def _raw_getter(self) -> _rawget.RawGetter:
        raw = self._raw
        if raw is None or raw.loop is not asyncio.get_running_loop() or raw.closed:
            raw = self._raw = _rawget.acquire_getter(
                self._endpoint, self._session_key.limit, self._session_key.trust
            )
        return raw

    async def close_session(self) -> None:
        """Release this loop's session; it closes when no other store uses it."""
        state = self._state
        self._state = None
        raw, self._raw = self._raw, None
        if raw is not None and raw.loop is asyncio.get_running_loop():
            _rawget.release_getter(raw)
        if state is not None and state[0] is asyncio.get_running_loop():
            await _http.release_session(self._session_key, state[1])

    # ------------------------------------------------------------ reads

    async def head(self, key: str) -> ObjectInfo:
        """Metadata of one object.

        Raises:
            NotFoundError: No such object.
        """
        url = self._object_url(key, _HEAD_QUERY)
        uri = self.uri(key)

        async def attempt() -> ObjectInfo:
            _, _, body = await self.request("GET", url, operation="head", uri=uri)
            return _http.parse_info(body, operation="head", uri=uri)

        return await self.call(attempt, "head", uri)

    async def _head_or_none(self, key: str) -> ObjectInfo | None:
        try:
            return await self.head(key)
        except NotFoundError:
            return None

    async def _head_once(self, key: str, operation: str) -> ObjectInfo | None:
        """One HEAD request, no retries of its own (it runs inside an attempt)."""
        uri = self.uri(key)
        url = self._object_url(key, _HEAD_QUERY)
        status, _, body = await self.request("GET", url, operation=operation, uri=uri, allow=(404,))
        if status == 404:
            return None
        return _http.parse_info(body, operation=operation, uri=uri)

    async def upload_request(
        self,
        method: str,
        url: yarl.URL,
        *,
        operation: str,
        uri: str,
        headers: Mapping[str, str] | None = None,
        data: Any = None,
        allow: tuple[int, ...] = (),
    ) -> _Response:
        """:meth:`request` for a request whose bytes carry a declared checksum.

        The store refuses such a request when what it received does not match
        (https://cloud.google.com/storage/docs/data-validation): nothing was
        written, so the refusal is an :class:`IntegrityError`, which a retry
        may cure (the damage was in transit) and which says what happened when
        it persists.

        Raises:
            IntegrityError: The store refused the bytes it received.
            StorageError: As :meth:`request`.
        """
        status, resp_headers, body = await self.request(
            method,
            url,
            operation=operation,
            uri=uri,
            headers=headers,
            data=data,
            allow=(*allow, 400),
        )
        if status == 400 and 400 not in allow:
            reason, message = _http.error_code(body)
            if refused_checksum(reason, message):
                raise IntegrityError(
                    f"the server refused what it received: {message or reason}",
                    operation=operation,
                    uri=uri,
                    status=400,
                )
            raise _http.error_for_response(status, resp_headers, body, operation=operation, uri=uri)
        return status, resp_headers, body

    # ------------------------------------------------------------ uncertain writes

    async def write(
        self,
        send: Callable[[int | None], Awaitable[ObjectInfo]],
        key: str,
        *,
        size: int,
        crc32c: str | None,
        if_generation_match: int | None,
        operation: str,
    ) -> ObjectInfo:
        """Run a write with retries that never repeat it blindly.

        ``send(precondition)`` makes one attempt, with ``ifGenerationMatch`` set
        to ``precondition`` (``None``: no precondition). The first attempt uses
        ``if_generation_match``. After an attempt whose outcome is uncertain
        (see :func:`uncertain`):

        - without a precondition, the object is read before the next attempt
          (one HEAD): if it holds what was sent (``size`` and ``crc32c``), that
          was this write and it is returned; otherwise the next attempts are
          pinned to the generation just seen (0 for no object), so a repeat
          cannot overwrite a write made meanwhile by someone else;
        - with one, the repeat meets a 412 if the lost attempt took effect, and
          a 412 after an uncertain attempt is checked the same way;
        - when retries give up after an uncertain attempt, the object is
          checked once more (:meth:`written_anyway`).

        So an unconditional write costs one request when nothing fails, and is
        retried like any idempotent request when something does.

        Raises:
            PreconditionFailedError: ``if_generation_match`` (or the generation
                seen before a retry) did not hold, and the object is not this
                write's.
            StorageError: The write failed and the object does not hold what
                was sent.
        """
        uri = self.uri(key)
        precondition = if_generation_match
        unsure = False

        async def attempt() -> ObjectInfo:
            nonlocal precondition, unsure
            if unsure and precondition is None:
                info = await self._head_once(key, operation)
                if info is not None and holds(info, size, crc32c):
                    logger.debug("%s %s: an earlier attempt took effect", operation, uri)
                    return info
                precondition = 0 if info is None else info.generation
            try:
                return await send(precondition)
            except PreconditionFailedError:
                if unsure:
                    info = await self._head_once(key, operation)
                    if info is not None and holds(info, size, crc32c):
                        logger.debug("%s %s: an earlier attempt took effect", operation, uri)
                        return info
                raise
            except (StorageError, asyncio.CancelledError) as exc:
                unsure = unsure or uncertain(exc)
                raise

        try:
            return await self.call(attempt, operation, uri)
        except (PreconditionFailedError, IntegrityError):
            raise
        except StorageError as exc:
            if not unsure:
                raise
            return await self.written_anyway(exc, key, size=size, crc32c=crc32c)

    async def written_anyway(
        self, error: StorageError, key: str, *, size: int, crc32c: str | None
    ) -> ObjectInfo:
        """The object, if a write that failed with ``error`` took effect after all.

        For a write whose outcome is uncertain (its answers were lost until the
        retry deadline, say): if the object now holds exactly what was sent,
        ``size`` bytes with ``crc32c``, the write is accepted.

        Raises:
            StorageError: ``error`` itself, when the object does not hold what
                was sent or cannot be read.
        """
        uri = self.uri(key)
        if not uncertain(error):
            raise error
        try:
            info = await self._head_or_none(key)
        except StorageError:
            logger.debug("%s: could not check the object after a failed write", uri, exc_info=True)
            info = None
        if info is None or not holds(info, size, crc32c):
            raise error
        logger.info(
            "%s %s failed (%s), but the object holds what was sent: accepted",
            error.operation,
            uri,
            type(error).__name__,
        )
        return info

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

    async def read_object(self, url: yarl.URL, key: str, start: int, end: int | None) -> bytes:
        """GET ``url`` (``alt=media``), the range ``[start, end)``, verified."""
        uri = self.uri(key)
        headers = range_header(start, end)

        async def attempt() -> bytes:
            status, resp_headers, body = await self.request(
                "GET", url, operation="get", uri=uri, headers=headers, allow=(416,)
            )
            if status == 416:
                if start and await self._transcoded(key):
                    return (await _gzip.read_decoded(self, url, uri))[start:end]
                return b""
            if _gzip.served_gzip(resp_headers):
                # The stored gzip bytes (see _gcs_gzip): decoded offsets need all of them.
                span = content_range(resp_headers)
                if status == 206 and not (span and span[0] == 0 and span[2] == len(body)):
                    return (await _gzip.read_decoded(self, url, uri))[start:end]
                decoded = _gzip.decode_answer(resp_headers, body, uri)
                return decoded if headers is None else decoded[start:end]
            if status == 206:
                span = content_range(resp_headers)
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
                        verify_crc32c(resp_headers, crc_b64(extend_crc(0, body)), uri)
                return body
            verify_crc32c(resp_headers, crc_b64(extend_crc(0, body)), uri)
            if headers is not None:  # the server ignored the Range header
                return body[start:end]
            return body

        return await self.call(attempt, "get", uri)

    async def read_object_into(
        self, url: yarl.URL, key: str, start: int, buffer: memoryview
    ) -> int:
        """GET ``[start, start + len(buffer))`` of ``url`` straight into ``buffer``.

        Ranges of at least :data:`~torchbucket.storage._gcs_rawget.MIN_BYTES`
        go through :class:`~torchbucket.storage._gcs_rawget.RawGetter`, which
        receives the body in place; an answer it does not read is asked for
        again through aiohttp.
        """
        uri = self.uri(key)
        size = len(buffer)
        headers = {"Range": f"bytes={start}-{start + size - 1}"}
        raw = self._raw_ok and size >= _rawget.MIN_BYTES

        async def attempt() -> int:
            session = self._loop_state()[1]
            hdrs = await self._headers(headers, "get", uri)
            if raw:
                got = await self._raw_getter().read_into(
                    url,
                    hdrs or headers,
                    buffer,
                    start,
                    uri=uri,
                    connect_timeout=self._session_key.connect_timeout,
                    read_timeout=self._read_timeout,
                )
                if got is not None:
                    return got
            accounting.count("get")
            try:
                async with session.get(url, headers=hdrs, **self._streaming_kw) as resp:
                    if resp.status == 416:
                        if start and await self._transcoded(key):
                            return await self._decoded_into(url, uri, start, buffer)
                        return 0
                    if resp.status < 300 and _gzip.served_gzip(resp.headers):
                        # Stored gzip bytes (see _gcs_gzip): decoded offsets need all of them.
                        resp.release()
                        return await self._decoded_into(url, uri, start, buffer)
                    if resp.status >= 300:
                        body = await resp.read()
                        raise _http.error_for_response(
                            resp.status, resp.headers, body, operation="get", uri=uri
                        )
                    if resp.status == 200:  # Range ignored: take our slice of the whole
                        whole = await resp.read()
                        accounting.received(len(whole))
                        verify_crc32c(resp.headers, crc_b64(extend_crc(0, whole)), uri)
                        piece = whole[start : start + size]
                        buffer[: len(piece)] = piece
                        return len(piece)
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
                        buffer[pos : pos + n] = chunk
                        if whole_object:
                            crc = extend_crc(crc, chunk)
                        pos += n
                    accounting.received(pos)
                    if span is not None and check_span(span, start, pos, uri):
                        verify_crc32c(resp.headers, crc_b64(crc), uri)
                    return pos
            except StorageError:
                raise  # NotFoundError is an OSError too: keep it as it is
            except _TRANSPORT_ERRORS as exc:
                raise self._transport_error(exc, "get", uri) from exc

        return await self.call(attempt, "get", uri)

    async def _transcoded(self, key: str) -> bool:
        """Whether ``key`` is served decoded (after a 416: its decoded bytes may go on)."""
        info = await self._head_once(key, "get")
        return info is not None and info.transcoded

    async def _decoded_into(self, url: yarl.URL, uri: str, start: int, buffer: memoryview) -> int:
        piece = (await _gzip.read_decoded(self, url, uri))[start : start + len(buffer)]
        buffer[: len(piece)] = piece
        return len(piece)

    async def open_media(
        self, url: yarl.URL, headers: Mapping[str, str] | None, uri: str
    ) -> aiohttp.ClientResponse:
        """Open a streamed GET of ``url``; an error status raises its mapped error."""
        session = self._loop_state()[1]
        hdrs = await self._headers(headers, "stream", uri)
        accounting.count("get")
        try:
            resp = await session.get(url, headers=hdrs, **self._streaming_kw)
            if resp.status >= 300:
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
            headers = range_header(pos, end)

            async def open_response(
                url: yarl.URL = url, headers: Mapping[str, str] | None = headers
            ) -> aiohttp.ClientResponse:
                session = self._loop_state()[1]
                hdrs = await self._headers(headers, "stream", uri)
                accounting.count("get")
                try:
                    resp = await session.get(url, headers=hdrs, **self._streaming_kw)
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
            if pos == start and _gzip.served_gzip(resp.headers):
                # Stored gzip bytes: streamed decoded, from the stored offset 0 (_gcs_gzip).
                first = resp.headers.get("x-goog-generation")
                resp.release()
                async for piece in _gzip.stream_decoded(
                    self, url_for, key, start, end, chunk_size, int(first) if first else None
                ):
                    yield piece
                return
            broken: BaseException | None = None
            try:
                if resp.status == 416:
                    return
                if generation is None and resp.headers.get("x-goog-generation"):
                    generation = int(resp.headers["x-goog-generation"])
                span = content_range(resp.headers)
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
                        accounting.received(len(chunk))
                        if crc is not None:
                            crc = extend_crc(crc, chunk)
                        yield chunk
                        if end is not None and pos >= end:
                            break
                except _TRANSPORT_ERRORS as exc:
                    broken = exc
            finally:
                resp.release()
            stop = stream_end(end, total)
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
            verify_crc32c(resp.headers, crc_b64(crc), uri)
