"""The GCS transport: how one request to one bucket is sent.

:class:`GCSTransport` is what :class:`~torchbucket.storage.gcs.GCSStore` owns
and every operation takes (as httpx's ``Client`` owns a ``Transport``): the
aiohttp session of the running loop (:mod:`._session`), the credentials
(:mod:`._credentials`), the process's adaptive limiter and retries
(:func:`torchbucket.retry.call`), the loop's watchdog, the one error mapping
(:mod:`._errors`), request accounting, and the in-place ranged reader
(:mod:`._rawget`). The operations themselves (reads, the upload protocols,
compose, listing, an object's metadata in :mod:`._head`) live in their own
modules: they build their URLs from :attr:`GCSTransport.urls` (:mod:`._urls`)
and call :meth:`GCSTransport.call` around attempts made of
:meth:`GCSTransport.request`. The transport only sends what it is given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import yarl
from multidict import CIMultiDictProxy

from torchbucket.errors import (
    IntegrityError,
    StorageError,
    TransientError,
)
from torchbucket.runtime import accounting, budget, retry, watchdog
from torchbucket.storage.gcs import _errors, _hedge, _rawget, _session
from torchbucket.storage.gcs._credentials import shared_credentials
from torchbucket.storage.gcs._urls import BucketURLs
from torchbucket.storage.gcs.config import GCSConfig

__all__ = ["TRANSPORT_ERRORS", "GCSTransport", "Response"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A whole answer: status, headers, body.
Response = tuple[int, "CIMultiDictProxy[str]", bytes]
#: What aiohttp and asyncio raise for a failed exchange (mapped by :mod:`._errors`).
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_LoopState = tuple[
    asyncio.AbstractEventLoop, aiohttp.ClientSession, retry.AdaptiveLimiter, watchdog.Watchdog
]


def _sent_size(data: Any) -> int:
    """Body bytes of a request's ``data`` (0 for none, or a body of unknown size)."""
    if data is None:
        return 0
    try:
        return len(data)
    except TypeError:
        return 0


class GCSTransport:
    """Session, credentials, limiter, retries and error mapping for one bucket.

    Args:
        bucket: The bucket name.
        config: The store's configuration (endpoint, credentials, retries,
            concurrency, timeouts).
    """

    def __init__(self, bucket: str, config: GCSConfig) -> None:
        endpoint, anonymous = config.resolved_endpoint()
        self._bucket = bucket
        self._endpoint = endpoint
        self._credentials = shared_credentials(anonymous=anonymous, user_project=config.project)
        #: ``GCSConfig.project``: quota and billing, and the owner of a bucket created.
        self.project = config.project
        self._retry_config = config.retry
        self._concurrency = config.concurrency
        self._budget_config = config.budget
        # Made here, where the dataset is built (the rank's main process), so
        # that its DataLoader workers find it, even if this rank never reads.
        budget.job_budget(bucket, config.budget)
        self._session_key = session_key = _session.SessionKey(
            limit=config.concurrency.max_in_flight,
            read_timeout=config.retry.read_timeout,
            connect_timeout=config.connect_timeout,
            tls=endpoint.startswith("https:"),
        )
        #: Seconds without a byte before a read is cut short.
        self.read_timeout = session_key.read_timeout
        #: Seconds to open a connection.
        self.connect_timeout = session_key.connect_timeout
        #: For bodies read chunk by chunk, and uploads: aiohttp's read timeout,
        #: which starts once the request is sent and rescheduled on every chunk.
        self.streaming_kw: dict[str, Any] = {
            "timeout": aiohttp.ClientTimeout(
                total=None,
                sock_read=session_key.read_timeout,
                sock_connect=session_key.connect_timeout,
            )
        }
        self._upload_kw: dict[str, Any] = {
            **self.streaming_kw,
            # No Content-Type but the one given: aiohttp's would be octet-stream.
            "skip_auto_headers": ("Content-Type",),
        }
        self._state: _LoopState | None = None
        #: Whether the in-place ranged reader can talk to the endpoint.
        self.raw_ok = _rawget.supported(endpoint)
        self._raw: _rawget.RawGetter | None = None
        #: Hedges slow reads (:mod:`._hedge`); ``None`` when hedging is off.
        self.hedger = _hedge.get_hedger(endpoint, config.hedge)
        #: The bucket's URLs and ``gs://`` URIs, which the operations build requests from.
        self.urls = BucketURLs(endpoint, bucket)

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket

    @property
    def endpoint(self) -> str:
        """The base URL requests go to."""
        return self._endpoint

    # ------------------------------------------------------------ one request

    def loop_state(self) -> _LoopState:
        """The running loop's (loop, session, limiter, watchdog), made on first use."""
        loop = asyncio.get_running_loop()
        state = self._state
        if state is None or state[0] is not loop or state[1].closed:
            state = self._state = (
                loop,
                _session.acquire_session(self._session_key),
                retry.get_limiter(self._endpoint, self._concurrency),
                watchdog.watchdog(loop),
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
        token (:meth:`~torchbucket.storage.gcs._credentials.Credentials.reauthorizing`).
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
            limiter=self.loop_state()[2],
            budget=self.job_budget(),
        )

    def job_budget(self) -> budget.Budget | None:
        """The job-wide request budget of this bucket in this process, or ``None`` when off."""
        return budget.job_budget(self._bucket, self._budget_config)

    async def headers(
        self, extra: Mapping[str, str] | None, operation: str, uri: str
    ) -> Mapping[str, str] | None:
        """The headers of one request: authorization (if any) and ``extra``."""
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
    ) -> Response:
        """Send one request and read its whole answer.

        Raises:
            StorageError: The mapped error for a status >= 300 not in ``allow``,
                or for a transport failure.
        """
        _, session, _, dog = self.loop_state()
        hdrs = await self.headers(headers, operation, uri)
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
            except TRANSPORT_ERRORS as exc:
                raise self.transport_error(exc, operation, uri) from exc
        else:
            # The loop's watchdog cuts the request short after read_timeout
            # without a byte (headers included): no timer per request or chunk.
            # Unlike aiohttp's sock_read the silence counts from the start, a
            # wait for a pooled connection included (the limiter keeps the
            # requests in flight within the pool's size).
            response: aiohttp.ClientResponse | None = None
            watch = dog.start(
                quiet=self.read_timeout,
                progress=lambda: -1 if response is None else response.content.total_bytes,
            )
            try:
                async with session.request(method, url, headers=hdrs) as response:
                    body = await response.read()
                    status = response.status
                    resp_headers = response.headers
            except TRANSPORT_ERRORS as exc:
                raise self.transport_error(exc, operation, uri) from exc
            except asyncio.CancelledError:
                if dog.stop(watch):
                    raise TransientError(
                        f"no data from the server for {self.read_timeout:g} s (read timeout)",
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
            raise _errors.error_for_response(
                status, resp_headers, body, operation=operation, uri=uri, bucket_op=bucket_op
            )
        return status, resp_headers, body

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
        bucket_op: bool = False,
    ) -> Response:
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
            bucket_op=bucket_op,
        )
        if status == 400 and 400 not in allow:
            reason, message = _errors.error_code(body)
            if _errors.refused_checksum(reason, message):
                raise IntegrityError(
                    f"the server refused what it received: {message or reason}",
                    operation=operation,
                    uri=uri,
                    status=400,
                )
            raise _errors.error_for_response(
                status, resp_headers, body, operation=operation, uri=uri
            )
        return status, resp_headers, body

    async def open_stream(
        self,
        url: yarl.URL,
        headers: Mapping[str, str] | None,
        uri: str,
        *,
        allow: tuple[int, ...] = (),
    ) -> aiohttp.ClientResponse:
        """Open a streamed GET of ``url``: its body is the caller's to read and release.

        Raises:
            StorageError: The mapped error for a status >= 300 not in ``allow``,
                or for a transport failure.
        """
        session = self.loop_state()[1]
        hdrs = await self.headers(headers, "stream", uri)
        accounting.count("get")
        try:
            resp = await session.get(url, headers=hdrs, **self.streaming_kw)
            if resp.status >= 300 and resp.status not in allow:
                body = await resp.read()
                resp.release()
                raise _errors.error_for_response(
                    resp.status, resp.headers, body, operation="stream", uri=uri
                )
            return resp
        except StorageError:
            raise  # NotFoundError is an OSError too: keep it as it is
        except TRANSPORT_ERRORS as exc:
            raise self.transport_error(exc, "stream", uri) from exc

    def transport_error(self, exc: BaseException, operation: str, uri: str) -> StorageError:
        """The :mod:`torchbucket.errors` type of a failed exchange."""
        error = _errors.unreachable_error(
            exc, self._endpoint, operation=operation, uri=uri
        ) or _errors.error_for_exception(exc, operation=operation, uri=uri)
        return error or TransientError(
            f"request failed ({type(exc).__name__})", operation=operation, uri=uri
        )

    def raw_getter(self) -> _rawget.RawGetter:
        """The running loop's in-place ranged reader for the endpoint."""
        raw = self._raw
        if raw is None or raw.loop is not asyncio.get_running_loop() or raw.closed:
            raw = self._raw = _rawget.acquire_getter(
                self._endpoint, self._session_key.limit, self._session_key.trust
            )
        return raw

    async def close(self) -> None:
        """Release this loop's session and reader; they close when no other store uses them."""
        state = self._state
        self._state = None
        raw, self._raw = self._raw, None
        if raw is not None and raw.loop is asyncio.get_running_loop():
            _rawget.release_getter(raw)
        if state is not None and state[0] is asyncio.get_running_loop():
            await _session.release_session(self._session_key, state[1])
