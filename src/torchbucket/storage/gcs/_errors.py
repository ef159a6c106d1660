"""Error mapping and answer decoding of the GCS backend.

:func:`error_for_response` is the one place where HTTP statuses and bodies become
:mod:`torchbucket.errors` types; :func:`error_for_exception` does the same for
``aiohttp`` and timeout exceptions, and :func:`refused_checksum` recognises the
answer of a store that refused bytes failing their declared checksum.
:func:`parse_json`, :func:`parse_info` and :func:`parse_body` are the one place
where answer bodies are decoded: a body that cannot be (garbled or cut short in
transit) is a :class:`TransientError`.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import os
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from torchbucket.errors import (
    BucketNotFoundError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    StorageError,
    ThrottledError,
    TransientError,
    UnreachableError,
)
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs._wire import object_info

__all__ = [
    "STATUS_ERRORS",
    "error_code",
    "error_for_exception",
    "error_for_response",
    "parse_body",
    "parse_info",
    "parse_json",
    "refused_checksum",
    "unreachable_error",
]

T = TypeVar("T")

_MESSAGE_LIMIT = 300


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
        # GCS's own message already says so ("The specified bucket b does not
        # exist."): one sentence, not the same one twice.
        if "bucket" not in message.lower():
            message = f"bucket does not exist ({message})"
        return BucketNotFoundError(message, **kw)
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


def is_local_endpoint(endpoint: str) -> bool:
    """Whether ``endpoint`` is on this machine or is ``$STORAGE_EMULATOR_HOST``'s host."""
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not emulator:
        return False
    emulator_host = urlsplit(emulator if "://" in emulator else f"http://{emulator}").hostname
    return bool(emulator_host) and emulator_host == host


_UNREACHABLE_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL}
)


def _connect_failure(exc: BaseException) -> str | None:
    """What kept a connection from opening, or ``None`` if ``exc`` is not that."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        exc = exc.os_error
    if isinstance(exc, socket.gaierror):
        return "its host name does not resolve"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS:
        return os.strerror(exc.errno).lower() if exc.errno is not None else None
    if isinstance(exc, OSError) and "Connect call failed" in str(exc):
        # asyncio's error when every address of the host refused (no errno).
        return "connection refused"
    return None


def unreachable_error(
    exc: BaseException, endpoint: str, *, operation: str, uri: str
) -> UnreachableError | None:
    """An :class:`UnreachableError` for a connection a local endpoint refused, else ``None``.

    Why: a refused connection to the emulator's address (not running, or
    restarted on another port) was retried as a transient GCS fault until the
    retry deadline, five minutes, after one warning. Google's endpoint keeps
    that: a connection it refuses is an outage worth riding out.

    Args:
        exc: What opening the connection raised.
        endpoint: The endpoint it was opened to, named in the message.
        operation: Named in the error.
        uri: Named in the error.
    """
    if not is_local_endpoint(endpoint):
        return None
    why = _connect_failure(exc)
    if why is None:
        return None
    message = f"cannot connect to {endpoint}: {why}"
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if emulator:
        message += f"; is the emulator running? (STORAGE_EMULATOR_HOST={emulator})"
    return UnreachableError(message, operation=operation, uri=uri)


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
