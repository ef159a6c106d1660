"""Large ranged GETs received straight into the caller's buffer.

Why not aiohttp for these: it receives every chunk into a new ``bytes`` (the
socket's ``recv``), its parser slices the body out of it, and the read
(``_reads.read_into``) then copied the slice into the buffer, with Python work
per chunk in between. Here an :class:`asyncio.BufferedProtocol`
(:mod:`torchbucket.storage.gcs._rawconn`) hands the kernel the
destination slice itself: ``recv_into`` writes the body where it belongs, one
copy, and the only Python per chunk is a counter. Measured on a 2-core VM
against the emulator with the same-region latency model, 512 MiB in 64 ranges of
8 MiB, 32 in flight, into one buffer: through aiohttp 0.64-1.0 s and 0.3-0.7
CPU seconds; through a first cut of this client 0.36-0.42 s and 0.12-0.15 CPU
seconds. In the checkpoint benchmark's load (``--quick``) the loop thread's CPU
went from 0.7-1.25 s to about 0.1 s (with the buffer prefaulted by the waiting
thread, see ``checkpoint/_reader.py``).

It is a deliberately small HTTP/1.1 client for one exchange: a ``GET`` with a
``Range`` header, answered with a ``Content-Length`` body (a 206, or an error
status with a short body). Anything else (a chunked or otherwise
transfer-coded answer, a content-encoded one such as the stored bytes of a gzip
object, a 200 that ignored the range, a 1xx, 204 or 304, an error
body over 1 MiB, a header block over 64 KiB) makes :meth:`RawGetter.read_into`
return ``None`` and the caller repeats the request through aiohttp, which
handles everything. Like the aiohttp session (``trust_env`` off), it uses no
proxy from the environment. HTTPS needs Python 3.11, whose SSL transport
decrypts into a buffered protocol's buffer; it trusts what the aiohttp session
trusts (``_session.ssl_context``: the system's CAs, ``SSL_CERT_FILE``,
``SSL_CERT_DIR``, ``REQUESTS_CA_BUNDLE``).

Connections are kept alive in a pool per event loop and origin, shared by the
stores of that endpoint (closed with the last, at shutdown, or after 30 s idle).
A new connection has ``connect_timeout``; the answer is cut short after
``read_timeout`` without a byte (the loop's watchdog), as aiohttp's ``sock_read``
does. A pooled connection the server closed meanwhile is replaced once at no
cost of an attempt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import yarl

from torchbucket import runtime
from torchbucket.errors import IntegrityError, TransientError
from torchbucket.runtime import accounting, watchdog
from torchbucket.storage.gcs import _errors, _session
from torchbucket.storage.gcs._rawconn import FALLBACK, TOO_LONG, Connection, content_length
from torchbucket.storage.gcs._wire import (
    check_span,
    content_range,
    crc_b64,
    extend_crc,
    hash_header_crc32c,
    verify_crc32c,
)

__all__ = ["MIN_BYTES", "RawGetter", "acquire_getter", "release_getter", "supported"]

logger = logging.getLogger(__name__)

#: Ranges at least this long go through :class:`RawGetter`; shorter ones gain
#: little and stay on aiohttp.
MIN_BYTES = 1 << 20

_IDLE_SECONDS = 30.0  # aiohttp's keepalive_timeout in _session
_DEFAULT_PORTS = {"http": 80, "https": 443}


def supported(endpoint: str) -> bool:
    """Whether :class:`RawGetter` can talk to ``endpoint``."""
    scheme = yarl.URL(endpoint).scheme
    return scheme == "http" or (scheme == "https" and sys.version_info >= (3, 11))


class RawGetter:
    """Ranged GETs into buffers over keep-alive connections to one origin, on one loop.

    Made on the loop it serves (see :func:`acquire_getter`).

    Args:
        endpoint: ``http://host[:port]`` or ``https://...`` (see :func:`supported`).
        limit: Idle connections kept at most.
        ssl_context: For HTTPS; default ``_session.ssl_context()``.

    Raises:
        ValueError: An endpoint it cannot reach.
    """

    def __init__(
        self, endpoint: str, limit: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        url = yarl.URL(endpoint)
        if not supported(endpoint) or not url.host:
            raise ValueError(f"RawGetter cannot reach {endpoint!r}")
        self.endpoint = endpoint
        self.limit = limit
        self._host = url.host
        self._port = url.port or _DEFAULT_PORTS[url.scheme]
        host = url.raw_host or self._host
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        if self._port != _DEFAULT_PORTS[url.scheme]:
            host = f"{host}:{self._port}"
        self._ssl = (ssl_context or _session.ssl_context()) if url.scheme == "https" else None
        self._loop = asyncio.get_running_loop()
        self._idle: list[Connection] = []
        self._sweep: asyncio.TimerHandle | None = None
        self.closed = False
        self.trust: tuple[str | None, ...] = ()  # set by acquire_getter
        # What aiohttp's session sends with every request.
        self._prefix = (
            f"Host: {host}\r\nUser-Agent: {_session.user_agent()}\r\n"
            "Accept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop it serves."""
        return self._loop

    # ---------------------------------------------------------- the read

    async def read_into(
        self,
        url: yarl.URL,
        headers: Mapping[str, str],
        buffer: memoryview,
        start: int,
        *,
        uri: str,
        connect_timeout: float,
        read_timeout: float,
    ) -> int | None:
        """GET ``url`` with ``headers`` (its ``Range`` included) and fill ``buffer``.

        Returns:
            The bytes received (0 for a 416), or ``None`` when the answer is not
            one this client reads: the caller repeats the request otherwise.

        Raises:
            StorageError: The mapped error for an error status; ``TransientError``
                for a failed or silent connection; ``IntegrityError`` for an answer
                that does not fit the range asked for.
        """
        request = self._request(url, headers)
        if request is None:
            return None
        accounting.count("get")
        conn, reused = await self._acquire(uri, connect_timeout)
        try:
            try:
                outcome = await self._exchange(conn, request, buffer, uri, read_timeout)
            except ConnectionError:
                if not reused or conn.received:
                    raise
                # The server closed the idle connection as we sent: a fresh one.
                logger.debug("%s: pooled connection was closed; reconnecting", uri)
                conn, _ = await self._acquire(uri, connect_timeout, fresh=True)
                outcome = await self._exchange(conn, request, buffer, uri, read_timeout)
        except OSError as exc:
            what = "lost mid-response" if conn.received else "failed"
            raise TransientError(
                f"connection {what} ({type(exc).__name__})", operation="get", uri=uri
            ) from exc
        if outcome == FALLBACK:
            conn.close()
            return None
        status, resp_headers = conn.status, conn.headers
        if outcome == TOO_LONG:
            conn.close()
            raise IntegrityError(
                f"server sent more than the {len(buffer)} bytes asked for",
                operation="get",
                uri=uri,
            )
        body = conn.take_error_body()
        self._give(conn)
        if status == 416:
            return 0
        if status >= 300:
            raise _errors.error_for_response(status, resp_headers, body, operation="get", uri=uri)
        received = content_length(resp_headers) or 0
        accounting.received(received)
        span = content_range(resp_headers)
        # Only a range that is the whole object can be checked against its CRC32C
        # (checksummed in place, and only when the server sent one).
        if (
            span is not None
            and check_span(span, start, received, uri)
            and hash_header_crc32c(resp_headers) is not None
        ):
            verify_crc32c(resp_headers, crc_b64(extend_crc(0, buffer[:received])), uri)
        return received

    async def _exchange(
        self, conn: Connection, request: bytes, buffer: memoryview, uri: str, quiet: float
    ) -> str:
        answer = conn.send(request, buffer)
        dog = watchdog.watchdog(self._loop)
        watch = dog.start(quiet=quiet, progress=lambda: conn.received)
        clean = False
        try:
            outcome = await answer
            clean = True
            return outcome
        except asyncio.CancelledError:
            if dog.stop(watch):
                raise TransientError(
                    f"no data from the server for {quiet:g} s (read timeout)",
                    operation="get",
                    uri=uri,
                ) from None
            raise
        finally:
            dog.stop(watch)
            if not clean:
                # Cut short: the socket must never write into the buffer again.
                conn.abort()

    def _request(self, url: yarl.URL, headers: Mapping[str, str]) -> bytes | None:
        lines = [f"GET {url.raw_path_qs} HTTP/1.1\r\n", self._prefix]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                return None  # aiohttp rejects it with a clear error
            lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        try:
            return "".join(lines).encode("latin-1")
        except UnicodeEncodeError:
            return None

    # ---------------------------------------------------------- the pool

    async def _acquire(
        self, uri: str, connect_timeout: float, *, fresh: bool = False
    ) -> tuple[Connection, bool]:
        now = self._loop.time()
        while self._idle and not fresh:
            conn = self._idle.pop()
            transport = conn.transport
            if (
                conn.closed
                or not conn.reusable
                or transport is None
                or transport.is_closing()
                or now - conn.idle_since >= _IDLE_SECONDS
            ):
                conn.close()
                continue
            return conn, True
        return await self._connect(uri, connect_timeout), False

    async def _connect(self, uri: str, timeout: float) -> Connection:
        dog = watchdog.watchdog(self._loop)
        watch = dog.start(timeout)
        try:
            transport, conn = await self._loop.create_connection(
                Connection,
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._ssl is not None else None,
            )
        except asyncio.CancelledError:
            if dog.stop(watch):
                raise TransientError(
                    f"no connection within {timeout:g} s", operation="get", uri=uri
                ) from None
            raise
        except OSError as exc:
            raise _errors.unreachable_error(
                exc, self.endpoint, operation="get", uri=uri
            ) or TransientError(
                f"connection failed ({type(exc).__name__})", operation="get", uri=uri
            ) from exc
        finally:
            dog.stop(watch)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _give(self, conn: Connection) -> None:
        if self.closed or not conn.reusable or conn.closed or len(self._idle) >= self.limit:
            conn.close()
            return
        conn.idle_since = self._loop.time()
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = self._loop.call_later(_IDLE_SECONDS, self._close_idle)

    def _close_idle(self) -> None:
        self._sweep = None
        now = self._loop.time()
        keep = []
        for conn in self._idle:
            if now - conn.idle_since >= _IDLE_SECONDS:
                conn.close()
            else:
                keep.append(conn)
        self._idle = keep
        if keep:
            self._sweep = self._loop.call_later(_IDLE_SECONDS, self._close_idle)

    def close(self) -> None:
        """Close the idle connections; those in use close when their answer is in."""
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


# ---------------------------------------------------------------- one per loop and endpoint


@dataclass(slots=True)
class _Entry:
    loop: asyncio.AbstractEventLoop
    getter: RawGetter
    users: int = 0


_getters: dict[tuple[int, str, tuple[str | None, ...]], _Entry] = {}
# Inherited over fork: kept referenced and never closed (see _session).
_abandoned: list[RawGetter] = []


def acquire_getter(
    endpoint: str, limit: int, trust: tuple[str | None, ...] | None = None
) -> RawGetter:
    """The getter for ``endpoint`` on the running loop; give it back with :func:`release_getter`.

    ``trust``: the TLS trust of the store's session (``SessionKey.trust``).
    """
    loop = asyncio.get_running_loop()
    trust = _session.ca_environment() if trust is None else trust
    key = (id(loop), endpoint, trust)
    entry = _getters.get(key)
    if entry is None or entry.loop is not loop or entry.getter.closed:
        context = _session.ssl_context(trust) if endpoint.startswith("https:") else None
        getter = RawGetter(endpoint, limit, context)
        getter.trust = trust
        entry = _getters[key] = _Entry(loop, getter)
    entry.users += 1
    return entry.getter


def release_getter(getter: RawGetter) -> None:
    """Give back a getter; the last user closes it."""
    key = (id(asyncio.get_running_loop()), getter.endpoint, getter.trust)
    entry = _getters.get(key)
    if entry is None or entry.getter is not getter:
        return
    entry.users -= 1
    if entry.users <= 0:
        del _getters[key]
        getter.close()


async def _close_getters() -> None:
    loop = asyncio.get_running_loop()
    for key, entry in list(_getters.items()):
        if entry.loop is loop:
            del _getters[key]
            entry.getter.close()


def _after_fork_in_child() -> None:
    for entry in _getters.values():
        entry.getter.closed = True
        _abandoned.append(entry.getter)
    _getters.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
runtime.at_shutdown(_close_getters)
