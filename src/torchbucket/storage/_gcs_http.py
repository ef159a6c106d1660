"""HTTP plumbing of the GCS backend: sessions, credentials and the error mapping.

One :class:`aiohttp.ClientSession` per (process, event loop, endpoint settings),
shared by every :class:`~torchbucket.storage.gcs.GCSStore` that uses it and
closed at process exit through :func:`torchbucket.runtime.at_shutdown`. A session
is never touched from another loop or another process: after ``fork`` the
parent's sessions are set aside without closing them (their sockets and the
epoll set still belong to the parent) and the child opens its own.

:func:`error_for_response` is the one place where HTTP statuses and bodies become
:mod:`torchbucket.errors` types; :func:`error_for_exception` does the same for
``aiohttp`` and timeout exceptions. :func:`parse_json`, :func:`parse_info` and
:func:`parse_body` are the one place where answer bodies are decoded: a body that
cannot be (garbled or cut short in transit) is a :class:`TransientError`.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import json
import logging
import os
import platform
import socket
import ssl
import threading
import time
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import aiohttp

from torchbucket import runtime
from torchbucket._version import __version__
from torchbucket.errors import (
    BucketNotFoundError,
    ConfigError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.storage._gcs_wire import object_info
from torchbucket.storage.base import ObjectInfo

__all__ = [
    "READ_WRITE_SCOPE",
    "STATUS_ERRORS",
    "Credentials",
    "SessionKey",
    "acquire_session",
    "ca_environment",
    "close_sessions",
    "error_code",
    "error_for_exception",
    "error_for_response",
    "parse_body",
    "parse_info",
    "parse_json",
    "release_session",
    "shared_credentials",
    "ssl_context",
    "user_agent",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_MESSAGE_LIMIT = 300


def user_agent() -> str:
    """``torchbucket/<version> python/<version> aiohttp/<version>``."""
    return (
        f"torchbucket/{__version__} python/{platform.python_version()} "
        f"aiohttp/{aiohttp.__version__}"
    )


# ---------------------------------------------------------------- sessions


@dataclass(frozen=True, slots=True)
class SessionKey:
    """What makes two stores able to share one session.

    The session itself has no read timeout: requests that stream a body pass
    ``read_timeout`` as aiohttp's ``sock_read``; whole-answer requests are
    watched by the loop's :mod:`~torchbucket._watchdog` instead (see
    ``GCSTransport.request``).

    ``trust`` is the TLS trust named by the environment when the store was made
    (see :func:`ssl_context`): a store made after ``SSL_CERT_FILE`` changed gets
    a session of its own.
    """

    limit: int
    read_timeout: float
    connect_timeout: float
    trust: tuple[str | None, ...] = field(default_factory=lambda: ca_environment())


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
            ssl=ssl_context(key.trust),
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


# ---------------------------------------------------------------- credentials

# A token is renewed in the background once this share of its lifetime is left,
# at most google-auth's REFRESH_THRESHOLD (3 min 45 s) ahead of its expiry, so
# requests never wait on the token service while their token is still good.
_RENEW_SHARE = 0.25
_RENEW_AHEAD_MAX = 225.0
# It stops being sent this share of its lifetime (at most 10 s) before it
# expires: the server's clock started before the answer reached us.
_EXPIRY_SLACK_SHARE = 0.05
_EXPIRY_SLACK_MAX = 10.0
# After a failed background renewal, the next waits this long (at most).
_RENEW_RETRY_MAX = 5.0
# The generation of the token last handed out in this task: the one a request
# that comes back 401 was sent with.
_sent_generation: contextvars.ContextVar[int] = contextvars.ContextVar(
    "torchbucket_token_generation", default=-1
)


class Credentials:
    """Google application default credentials, refreshed off the event loop.

    The ``Authorization`` header is built here and nowhere else; the token never
    reaches a log line or an error message.

    Token lifetime: ``google-auth`` loads the credentials (a service-account key
    file, the GCE/GKE metadata server, gcloud's user credentials...) and
    fetches tokens; this class decides when. A token is used until a quarter of
    its lifetime (at most 3 min 45 s) is left; from then on requests still go
    out with it while one refresh runs in the background, and only a request
    that finds it expired waits for the new one. A refresh runs in an executor
    thread, one at a time per process, and every request of the process shares
    its result. An answer of 401 (a token the server no longer accepts: revoked,
    or expired by its clock) drops the token; the request is sent once more
    with a new one (:meth:`reauthorizing`). After ``fork`` the child keeps the
    parent's token, and refreshes on its own when needed (a refresh the parent
    had in flight is not inherited).

    Args:
        anonymous: Send no credentials at all (emulators, public buckets).
        user_project: Project sent as ``x-goog-user-project`` (quota and
            requester-pays billing), or ``None``.
    """

    def __init__(self, *, anonymous: bool, user_project: str | None = None) -> None:
        self.anonymous = anonymous
        self._credentials: Any = None
        self._base: dict[str, str] = {"x-goog-user-project": user_project} if user_project else {}
        # (headers, renew_at, expire_at, generation) on the time.monotonic() clock,
        # replaced whole so that any thread reads a consistent one without a lock.
        self._state: tuple[dict[str, str], float, float, int] = (dict(self._base), 0.0, 0.0, 0)
        self._lock = threading.Lock()  # one google-auth refresh at a time
        self._inflight: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._next_renewal = 0.0
        #: Tokens this process fetched (a diagnostic; never the token itself).
        self.refreshes = 0
        _all_credentials.add(self)

    def __repr__(self) -> str:
        return f"Credentials(anonymous={self.anonymous})"

    @property
    def generation(self) -> int:
        """Increases with each new token; see :meth:`invalidate`."""
        return self._state[3]

    def ready_headers(self) -> Mapping[str, str] | None:
        """The headers of :meth:`headers` if no token needs fetching, else ``None``."""
        if self.anonymous:
            return self._base
        headers, renew_at, _, generation = self._state
        if time.monotonic() < renew_at:
            _sent_generation.set(generation)
            return headers
        return None

    async def headers(self, operation: str, uri: str) -> Mapping[str, str]:
        """Headers that authorise a request: none but the user project when anonymous.

        Args:
            operation: Named in an error.
            uri: Named in an error.

        Raises:
            PermissionDeniedError: No credentials could be found, or they were
                refused.
            TransientError: The token service could not be reached.
        """
        if self.anonymous:
            return self._base
        headers, renew_at, expire_at, generation = self._state
        now = time.monotonic()
        if now >= renew_at:
            if now < expire_at:
                # Still good: renew in the background, unless a renewal just failed.
                if now >= self._next_renewal:
                    self._refresh(generation)
            else:
                try:
                    await asyncio.shield(self._refresh(generation))
                except Exception as exc:
                    raise _credentials_error(exc, operation, uri) from exc
                headers, _, _, generation = self._state
        _sent_generation.set(generation)
        return headers

    def invalidate(self, generation: int) -> None:
        """Drop the token of ``generation`` (the server refused it): the next
        request fetches a new one. A newer token is kept."""
        headers, _, _, current = self._state
        if current == generation:
            self._state = (headers, 0.0, 0.0, current)
            self._next_renewal = 0.0

    def reauthorizing(self, attempt: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """``attempt``, sent once more with a new token if GCS answers it 401.

        A 401 means the request was not acted on, so the repeat is safe for any
        request. A second 401 (or a refused refresh) is the caller's
        :class:`PermissionDeniedError`.
        """

        async def run() -> T:
            _sent_generation.set(-1)
            try:
                return await attempt()
            except PermissionDeniedError as exc:
                if exc.status != 401:
                    raise
                logger.info(
                    "%s %s: token refused (HTTP 401); fetching a new one and sending again",
                    exc.operation,
                    exc.uri,
                )
                sent = _sent_generation.get()
                self.invalidate(self._state[3] if sent < 0 else sent)
            return await attempt()

        return run

    def _refresh(self, generation: int) -> asyncio.Future[None]:
        """The running loop's refresh in flight, started if there is none."""
        loop = asyncio.get_running_loop()
        inflight = self._inflight
        if inflight is not None and inflight[0] is loop and not inflight[1].done():
            return inflight[1]
        future = loop.run_in_executor(None, self._fetch, generation)
        future.add_done_callback(self._fetched)
        self._inflight = (loop, future)
        return future

    def _fetched(self, future: asyncio.Future[None]) -> None:
        # Retrieve a failure here too, so that a background one is never
        # "exception was never retrieved"; a waiting request raises it itself.
        if not future.cancelled() and future.exception() is not None:
            _, renew_at, expire_at, _ = self._state
            self._next_renewal = time.monotonic() + min(
                _RENEW_RETRY_MAX, max(0.0, expire_at - renew_at) / 4
            )
            logger.debug("token refresh failed: %s", type(future.exception()).__name__)

    def _fetch(self, generation: int) -> None:
        """Load the credentials if needed and fetch a token (an executor thread)."""
        import google.auth
        import google.auth.transport.requests
        import requests

        with self._lock:
            if self._state[3] != generation and time.monotonic() < self._state[1]:
                return  # another loop's refresh got a new token meanwhile
            creds = self._credentials
            loaded = creds is None
            if creds is None:
                creds, _ = google.auth.default(scopes=[READ_WRITE_SCOPE])
                self._credentials = creds
            if not (loaded and getattr(creds, "token", None) and getattr(creds, "valid", False)):
                # A session of its own, closed after: no pooled connection is
                # ever shared with a forked child.
                with requests.Session() as session:
                    creds.refresh(google.auth.transport.requests.Request(session))
                self.refreshes += 1
            self._install(creds.token, getattr(creds, "expiry", None))

    def _install(self, token: str, expiry: Any) -> None:
        now = time.monotonic()
        if expiry is None:
            left = float("inf")
        else:
            # google-auth's expiry is a naive datetime in UTC.
            if expiry.tzinfo is None:
                expiry = expiry.replace(tzinfo=datetime.timezone.utc)
            left = expiry.timestamp() - time.time()
        renew = min(_RENEW_AHEAD_MAX, left * _RENEW_SHARE)
        slack = min(_EXPIRY_SLACK_MAX, left * _EXPIRY_SLACK_SHARE)
        headers = {**self._base, "Authorization": f"Bearer {token}"}
        self._state = (headers, now + left - renew, now + left - slack, self._state[3] + 1)
        self._next_renewal = 0.0

    def _after_fork_in_child(self) -> None:
        # The parent's executor thread may have held the lock, and its refresh
        # future belongs to the parent's loop: neither exists here.
        self._lock = threading.Lock()
        self._inflight = None
        self._next_renewal = 0.0


_all_credentials: weakref.WeakSet[Credentials] = weakref.WeakSet()
_shared_credentials: dict[tuple[bool, str | None], Credentials] = {}


def _credentials_after_fork_in_child() -> None:
    for creds in list(_all_credentials):
        creds._after_fork_in_child()


os.register_at_fork(after_in_child=_credentials_after_fork_in_child)


def shared_credentials(*, anonymous: bool, user_project: str | None = None) -> Credentials:
    """One :class:`Credentials` per setting in this process, so stores share a token."""
    key = (anonymous, user_project)
    creds = _shared_credentials.get(key)
    if creds is None:
        creds = _shared_credentials[key] = Credentials(
            anonymous=anonymous, user_project=user_project
        )
    return creds


def _credentials_error(exc: Exception, operation: str, uri: str) -> StorageError:
    import google.auth.exceptions as auth_errors

    if isinstance(exc, auth_errors.TransportError) or getattr(exc, "retryable", False):
        return TransientError(
            f"could not reach the Google token service ({type(exc).__name__})",
            operation=operation,
            uri=uri,
        )
    # Shown: the default-credentials message (it names where credentials were
    # looked for), and of a refused grant only the OAuth error code and its
    # description (RFC 6749 section 5.2, e.g. "invalid_grant: Invalid JWT
    # Signature." for a deleted key), never the rest of the answer.
    missing = isinstance(exc, auth_errors.DefaultCredentialsError)
    detail = str(exc) if missing else _grant_error(exc)
    hint = (
        "; for an emulator set STORAGE_EMULATOR_HOST or GCSConfig(anonymous=True)"
        if missing
        else ""
    )
    return PermissionDeniedError(
        f"could not obtain Google credentials ({type(exc).__name__}{': ' if detail else ''}"
        f"{detail}){hint}",
        operation=operation,
        uri=uri,
    )


def _grant_error(exc: Exception) -> str:
    """``"error: description"`` of a token endpoint's refusal, or ``""``."""
    answer = exc.args[1] if len(exc.args) > 1 else None
    if not isinstance(answer, Mapping):
        return ""
    error, description = answer.get("error"), answer.get("error_description")
    if not isinstance(error, str) or not error.replace("_", "").isalnum():
        return ""
    if isinstance(description, str) and len(description) <= 200:
        return f"{error}: {description}"
    return error


# ---------------------------------------------------------------- errors


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    import time

    return max(0.0, when.timestamp() - time.time())


#: The one table from an HTTP status to the error type it raises, and so to
#: whether it is retried (:func:`torchbucket.retry.is_retryable` decides on the
#: type: :class:`ThrottledError` and :class:`TransientError` are retried).
#:
#: Retried: exactly the statuses of Google's retry strategy for Cloud Storage,
#: https://cloud.google.com/storage/docs/retry-strategy ("HTTP 408, 429, and 5xx
#: response codes"), narrowed to the 5xx that Google's own client
#: (google-cloud-storage, ``google/cloud/storage/retry.py``) retries: 500, 502,
#: 503, 504. A 501 (Not Implemented: an endpoint without the API asked for, such
#: as the XML multipart API) is an answer that every repeat would get again.
#: Every status not listed here is a plain, final :class:`StorageError`. A 404 on
#: a bucket request (or an XML ``NoSuchBucket``) is a :class:`BucketNotFoundError`.
STATUS_ERRORS: Mapping[int, type[StorageError]] = {
    401: PermissionDeniedError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: TransientError,
    412: PreconditionFailedError,
    429: ThrottledError,
    500: TransientError,
    502: TransientError,
    503: ThrottledError,  # Google's "slow down" as well as "unavailable": backs off the limiter
    504: TransientError,
}


def error_code(body: bytes) -> tuple[str, str]:
    """The machine-readable reason and the message of a GCS error body.

    Understands the JSON API's ``{"error": {"errors": [{"reason": ...}]}}`` and
    the XML API's ``<Error><Code>...</Code><Message>...</Message></Error>``.
    """
    text = body[:4096]
    stripped = text.lstrip()
    if stripped.startswith(b"{"):
        try:
            err = json.loads(body).get("error", {})
        except (ValueError, AttributeError):
            return "", text.decode("utf-8", "replace")
        if not isinstance(err, dict):
            return "", str(err)
        errors = err.get("errors") or [{}]
        reason = errors[0].get("reason", "") if isinstance(errors[0], dict) else ""
        return str(reason), str(err.get("message", ""))
    if stripped.startswith(b"<"):
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return "", text.decode("utf-8", "replace")
        code = message = ""
        for child in root.iter():
            tag = child.tag.rsplit("}", 1)[-1]
            if tag == "Code" and not code:
                code = child.text or ""
            elif tag == "Message" and not message:
                message = child.text or ""
        return code, message
    return "", text.decode("utf-8", "replace")


def error_for_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    operation: str,
    uri: str,
    bucket_op: bool = False,
) -> StorageError:
    """Translate an HTTP error response into a :mod:`torchbucket.errors` type.

    Args:
        status: The HTTP status (>= 300).
        headers: Response headers (for ``Retry-After``).
        body: Response body (a JSON or XML error document, or text).
        operation: Named in the error.
        uri: Named in the error.
        bucket_op: The request addressed the bucket itself (a listing), so a 404
            means the bucket is missing.
    """
    reason, message = error_code(body)
    message = (message or reason or "request failed").strip()[:_MESSAGE_LIMIT]
    kw: dict[str, Any] = {"operation": operation, "uri": uri, "status": status}
    if status == 404 and (bucket_op or reason == "NoSuchBucket"):
        return BucketNotFoundError(f"bucket does not exist ({message})", **kw)
    error = STATUS_ERRORS.get(status, StorageError)(message, **kw)
    if isinstance(error, ThrottledError):
        error.retry_after = _retry_after(headers)
    return error


def error_for_exception(exc: BaseException, *, operation: str, uri: str) -> StorageError | None:
    """Translate a transport exception, or ``None`` if it is not one."""
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        return TransientError(
            f"connection lost mid-response ({type(exc).__name__})", operation=operation, uri=uri
        )
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return TransientError("timed out waiting for the server", operation=operation, uri=uri)
    if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientResponseError)):
        return TransientError(
            f"connection failed ({type(exc).__name__})", operation=operation, uri=uri
        )
    if isinstance(exc, ConnectionError):
        return TransientError(
            f"connection failed ({type(exc).__name__})", operation=operation, uri=uri
        )
    return None


# ---------------------------------------------------------------- answer bodies


def _garbled(exc: Exception, operation: str, uri: str) -> TransientError:
    return TransientError(
        f"garbled answer ({type(exc).__name__}: {str(exc)[:120]})", operation=operation, uri=uri
    )


def parse_body(parse: Callable[[bytes], T], body: bytes, *, operation: str, uri: str) -> T:
    """``parse(body)``, with a body it cannot read mapped to :class:`TransientError`.

    A successful status with an unreadable body means the answer was damaged in
    transit: another attempt may get a good one. For a write, the request may
    have taken effect all the same; the caller treats the outcome as uncertain.

    Args:
        parse: Decodes the body (JSON, or one of the XML documents).
        body: The answer's body.
        operation: Named in the error.
        uri: Named in the error.

    Raises:
        TransientError: The body is not valid UTF-8, JSON or XML, or lacks what
            ``parse`` needs; chained from the decoding error.
    """
    try:
        return parse(body)
    except (ValueError, KeyError, TypeError, AttributeError, ET.ParseError) as exc:
        # ValueError covers json.JSONDecodeError and UnicodeDecodeError.
        raise _garbled(exc, operation, uri) from exc


def _json_object(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
    return doc


def parse_json(body: bytes, *, operation: str, uri: str) -> dict[str, Any]:
    """A JSON object answer; see :func:`parse_body`.

    Raises:
        TransientError: The body is not a JSON object.
    """
    return parse_body(_json_object, body, operation=operation, uri=uri)


def parse_info(body: bytes, *, operation: str, uri: str) -> ObjectInfo:
    """An object resource answer as :class:`ObjectInfo`; see :func:`parse_body`.

    Raises:
        TransientError: The body is not an object resource.
    """
    return parse_body(lambda b: object_info(_json_object(b)), body, operation=operation, uri=uri)
