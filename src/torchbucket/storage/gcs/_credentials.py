"""Google credentials of the GCS backend: the one place a token is fetched and sent."""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from torchbucket.errors import PermissionDeniedError, StorageError, TransientError

__all__ = ["READ_WRITE_SCOPE", "Credentials", "shared_credentials"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"

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
    # Said so that it works from the command line and from Python alike.
    hint = (
        "; sign in with `gcloud auth application-default login`, or for a public bucket "
        "set TORCHBUCKET_GCS_ANONYMOUS=1 (GCSConfig(anonymous=True) in Python), or for "
        "the local emulator set STORAGE_EMULATOR_HOST"
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
