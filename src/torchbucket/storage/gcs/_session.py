"""The aiohttp sessions of the GCS backend, and the TLS trust of every connection.

One :class:`aiohttp.ClientSession` per (process, event loop, :class:`SessionKey`),
shared by every :class:`~torchbucket.storage.gcs.GCSStore` that uses it and
closed at process exit through :func:`torchbucket.runtime.at_shutdown`. A session
is never touched from another loop or another process: after ``fork`` the
parent's sessions are set aside without closing them (their sockets and the
epoll set still belong to the parent) and the child opens its own.
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from torchbucket import runtime
from torchbucket._version import __version__
from torchbucket.errors import ConfigError

__all__ = [
    "SessionKey",
    "acquire_session",
    "ca_environment",
    "close_sessions",
    "release_session",
    "ssl_context",
    "user_agent",
]


def user_agent() -> str:
    """``torchbucket/<version> python/<version> aiohttp/<version>``."""
    return (
        f"torchbucket/{__version__} python/{platform.python_version()} "
        f"aiohttp/{aiohttp.__version__}"
    )


@dataclass(frozen=True, slots=True)
class SessionKey:
    """What makes two stores able to share one session.

    The session itself has no read timeout: requests that stream a body pass
    ``read_timeout`` as aiohttp's ``sock_read``; whole-answer requests are
    watched by the loop's :mod:`~torchbucket.runtime.watchdog` instead (see
    ``GCSTransport.request``).

    ``trust`` is the TLS trust named by the environment when the store was made
    (see :func:`ssl_context`): a store made after ``SSL_CERT_FILE`` changed gets
    a session of its own.
    """

    limit: int
    read_timeout: float
    connect_timeout: float
    trust: tuple[str | None, ...] = field(default_factory=lambda: ca_environment())
    #: Whether the endpoint is HTTPS. A plain-HTTP session (an emulator) does
    #: not build a TLS context of its own: loading the system's CAs costs
    #: ~50-100 ms of CPU, which a one-page listing in a fresh process paid in
    #: full. (Should it ever meet an https URL, aiohttp's default verified
    #: context, made when aiohttp is imported, applies.)
    tls: bool = True


@dataclass(slots=True)
class _Entry:
    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    users: int = 0


_sessions: dict[tuple[int, SessionKey], _Entry] = {}
# Sessions inherited over fork: kept referenced and marked closed, never closed,
# because closing them would unregister the parent's sockets from the epoll set
# that parent and child share.
_abandoned: list[aiohttp.ClientSession] = []


def _keepalive_socket_factory(addr_info: Any) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


#: Where TLS trust may come from, besides the system's CAs.
_CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")
_ssl_cache: dict[tuple[str | None, ...], ssl.SSLContext] = {}


def ca_environment() -> tuple[str | None, ...]:
    """The values of the variables that name CAs to trust (see :func:`ssl_context`)."""
    return tuple(os.environ.get(name) for name in _CA_VARIABLES)


def ssl_context(trust: tuple[str | None, ...] | None = None) -> ssl.SSLContext:
    """The TLS context of every HTTPS connection to a GCS endpoint.

    ``ssl.create_default_context()`` trusts the system's CAs, or those of
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` where set: OpenSSL reads the variables
    when a context is made, and aiohttp's own default context is made when
    aiohttp is imported, so variables set later would be missed. The CAs of
    ``REQUESTS_CA_BUNDLE`` (what ``requests``, and so ``google-auth`` and
    ``google-cloud-storage``, trust) are trusted as well. One context per
    value of these variables (``trust``, from :func:`ca_environment`; the
    current ones when ``None``).

    Raises:
        ConfigError: A variable names no readable CA file or directory.
    """
    env = ca_environment() if trust is None else trust
    cached = _ssl_cache.get(env)
    if cached is not None:
        return cached
    cert_file, cert_dir, bundle = env
    try:
        # From these values what OpenSSL would read from the variables (the
        # system's CAs where neither is set).
        context = ssl.create_default_context(cafile=cert_file, capath=cert_dir)
        if bundle:
            context.load_verify_locations(cafile=bundle)
    except (OSError, ssl.SSLError) as exc:
        named = ", ".join(f"{n}={v!r}" for n, v in zip(_CA_VARIABLES, env) if v)
        raise ConfigError(f"cannot load the CAs of {named}: {exc}") from exc
    _ssl_cache[env] = context
    return context


def acquire_session(key: SessionKey) -> aiohttp.ClientSession:
    """The session for ``key`` on the running loop, created on first use.

    Each store acquires it once per loop and releases it in ``close``; the
    session closes when its last store does, or at process exit.
    """
    loop = asyncio.get_running_loop()
    entry = _sessions.get((id(loop), key))
    if entry is None or entry.loop is not loop or entry.session.closed:
        connector = aiohttp.TCPConnector(
            limit=key.limit,
            limit_per_host=key.limit,
            ttl_dns_cache=300,
            use_dns_cache=True,
            keepalive_timeout=30.0,
            socket_factory=_keepalive_socket_factory,
            ssl=ssl_context(key.trust) if key.tls else True,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_read=None, sock_connect=key.connect_timeout
            ),
            headers={"User-Agent": user_agent()},
            auto_decompress=False,  # stored bytes, so that they match the stored CRC32C
        )
        entry = _sessions[(id(loop), key)] = _Entry(loop, session)
    entry.users += 1
    return entry.session


async def release_session(key: SessionKey, session: aiohttp.ClientSession) -> None:
    """Give back a session from :func:`acquire_session`; the last user closes it."""
    loop = asyncio.get_running_loop()
    entry = _sessions.get((id(loop), key))
    if entry is None or entry.session is not session:
        return
    entry.users -= 1
    if entry.users <= 0:
        del _sessions[(id(loop), key)]
        await session.close()


async def close_sessions() -> None:
    """Close this process's sessions that belong to the running loop."""
    loop = asyncio.get_running_loop()
    for map_key, entry in list(_sessions.items()):
        if entry.loop is loop:
            del _sessions[map_key]
            await entry.session.close()


def _after_fork_in_child() -> None:
    for entry in _sessions.values():
        session = entry.session
        connector = session.connector
        if connector is not None:
            connector._closed = True  # the parent owns its connections
        session._connector = None
        _abandoned.append(session)
    _sessions.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
runtime.at_shutdown(close_sessions)
