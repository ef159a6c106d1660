"""HTTP plumbing shared by the front server's handlers: errors, ranges, calls.

Errors follow GCS: the JSON API answers ``{"error": {"code", "message",
"errors": [{"reason", ...}]}}``, the XML API ``<Error><Code>...</Code>...``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from torchbucket.emulator._pieces import Pieces

__all__ = [
    "ASSEMBLED_HEADER",
    "ApiError",
    "Call",
    "error_response",
    "json_call",
    "json_response",
    "parse_range",
    "rfc3339",
]

_REASONS = {
    400: "invalid",
    401: "required",
    403: "forbidden",
    404: "notFound",
    405: "methodNotAllowed",
    408: "requestTimeout",
    409: "conflict",
    412: "conditionNotMet",
    416: "requestedRangeNotSatisfiable",
    429: "rateLimitExceeded",
    499: "clientClosedRequest",
    500: "backendError",
    501: "notImplemented",
    502: "badGateway",
    503: "backendError",
    504: "gatewayTimeout",
}

_XML_CODES = {
    400: "InvalidArgument",
    403: "AccessDenied",
    404: "NoSuchKey",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    409: "Conflict",
    412: "PreconditionFailed",
    416: "InvalidRange",
    429: "SlowDown",
    500: "InternalError",
    501: "NotImplemented",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "GatewayTimeout",
}

JSON_TYPE = "application/json; charset=UTF-8"
XML_TYPE = "application/xml; charset=UTF-8"
#: Marks the synthetic upload that stores a completed XML multipart upload: GCS
#: gives such objects a CRC32C but no MD5, as it does composite objects.
ASSEMBLED_HEADER = "X-Emulator-Assembled"


class ApiError(Exception):
    """An error answer, raised by handlers and rendered as JSON or XML.

    Args:
        status: HTTP status.
        message: Human-readable message.
        reason: GCS JSON ``reason``; derived from the status when omitted.
        xml_code: XML API ``Code``; derived from the status when omitted.
    """

    def __init__(
        self, status: int, message: str, *, reason: str | None = None, xml_code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason or _REASONS.get(status, "error")
        self.xml_code = xml_code or _XML_CODES.get(status, "Error")


def error_response(
    status: int,
    message: str,
    *,
    xml: bool = False,
    reason: str | None = None,
    xml_code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error answer in GCS's JSON shape, or its XML shape when ``xml``."""
    err = ApiError(status, message, reason=reason, xml_code=xml_code)
    if xml:
        body = (
            "<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
            f"{err.xml_code}</Code><Message>{_xml_escape(message)}</Message></Error>"
        ).encode()
        ctype = XML_TYPE
    else:
        payload = {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": err.reason}],
            }
        }
        body = json.dumps(payload).encode()
        ctype = JSON_TYPE
    out = web.Response(status=status, body=body, headers=headers)
    out.headers["Content-Type"] = ctype
    return out


def api_error_response(exc: ApiError, *, xml: bool = False) -> web.Response:
    """Render a raised :class:`ApiError`."""
    return error_response(
        exc.status, exc.message, xml=xml, reason=exc.reason, xml_code=exc.xml_code
    )


def json_response(body: bytes, status: int = 200) -> web.Response:
    """A JSON answer from already-encoded bytes."""
    return web.Response(status=status, body=body, headers={"Content-Type": JSON_TYPE})


def _xml_escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


xml_escape = _xml_escape


def rfc3339(seconds: float) -> str:
    """``seconds`` since the epoch as GCS writes times (UTC, milliseconds)."""
    whole = int(seconds)
    millis = int((seconds - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Parse a ``Range: bytes=...`` header against an object of ``size`` bytes.

    Args:
        header: The header value, or ``None``.
        size: Object size.

    Returns:
        ``None`` for the whole object, else the inclusive ``(first, last)``.

    Raises:
        ApiError: 416 when the range lies outside the object.
    """
    if not header or not header.startswith("bytes="):
        return None
    spec = header[6:].strip()
    if "," in spec:  # several ranges: GCS answers the whole object
        return None
    first_s, sep, last_s = spec.partition("-")
    if not sep:
        return None
    try:
        if not first_s:  # suffix: the last N bytes
            n = int(last_s)
            if n <= 0:
                raise ApiError(416, f"requested range {header!r} not satisfiable")
            if size == 0:
                return None
            return max(0, size - n), size - 1
        first = int(first_s)
        last = int(last_s) if last_s else size - 1
    except ValueError:
        return None
    if first >= size or last < first:
        if size == 0 and first == 0:
            return None
        raise ApiError(416, f"requested range {header!r} not satisfiable (size {size})")
    return first, min(last, size - 1)


@dataclass(slots=True)
class Route:
    """What a request is about, parsed once from its method, path and query.

    Attributes:
        op: Operation name (for faults, counters and latency).
        kind: Handler key, finer than ``op``.
        bucket: Bucket name, or ``""``.
        name: Object name, or ``""``.
        bucket2: Destination bucket of a copy or rewrite.
        name2: Destination object of a copy or rewrite.
        xml: Whether errors are rendered as XML.
    """

    op: str
    kind: str
    bucket: str = ""
    name: str = ""
    bucket2: str = ""
    name2: str = ""
    xml: bool = False


@dataclass(slots=True)
class Call:
    """One request as the backends see it (the body already read).

    Attributes:
        method: HTTP method.
        route: The parsed route.
        path_qs: Raw path and query string, as a proxy forwards them.
        query: Parsed query parameters.
        headers: Request headers.
        body: Request body.
        host: The ``Host`` header the client sent.
        scheme: ``"http"`` or ``"https"``: how the client reached the server
            (for the URLs it is given back, such as a resumable session's).
        assembled: A completed XML multipart upload's parts, the object's
            bytes in order (``body`` is then empty): the model store keeps
            them as they are (see ``_pieces``).
    """

    method: str
    route: Route
    path_qs: str
    query: Mapping[str, str]
    headers: CIMultiDictProxy[str] | CIMultiDict[str]
    body: bytes
    host: str
    scheme: str = "http"
    assembled: bytes | Pieces | None = None


def json_call(
    method: str,
    kind: str,
    bucket: str,
    name: str = "",
    *,
    query: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    host: str = "127.0.0.1",
    assembled: bytes | Pieces | None = None,
) -> Call:
    """A synthetic JSON API call (for the XML API and the admin API).

    Args:
        method: HTTP method.
        kind: Route kind: ``media``, ``metadata``, ``delete``, ``upload_media``,
            ``upload_multipart``,
            ``list``, ``bucket_get`` or ``bucket_create``.
        bucket: Bucket name.
        name: Object name.
        query: Query parameters.
        headers: Request headers.
        body: Request body.
        host: The Host header to send.
        assembled: An upload's bytes as parts (``Call.assembled``).
    """
    query = dict(query or {})
    qb, qn = quote(bucket, safe=""), quote(name, safe="")
    if kind in ("media", "metadata", "delete"):
        path = f"/storage/v1/b/{qb}/o/{qn}"
        if kind == "media":
            query["alt"] = "media"
    elif kind == "upload_media":
        path = f"/upload/storage/v1/b/{qb}/o"
        query = {"uploadType": "media", "name": name, **query}
    elif kind == "upload_multipart":
        path = f"/upload/storage/v1/b/{qb}/o"
        query = {"uploadType": "multipart", **query}
    elif kind == "list":
        path = f"/storage/v1/b/{qb}/o"
    elif kind == "bucket_get":
        path = f"/storage/v1/b/{qb}"
    elif kind == "bucket_create":
        path = "/storage/v1/b"
    else:
        raise ValueError(f"no synthetic call for {kind!r}")
    path_qs = path + ("?" + urlencode(query) if query else "")
    hdrs: CIMultiDict[str] = CIMultiDict(headers or {})
    hdrs["Host"] = host
    op = {"media": "get", "metadata": "head", "upload_media": "put", "upload_multipart": "put"}.get(
        kind, kind
    )
    route = Route(op, kind, bucket, name)
    return Call(method, route, path_qs, query, hdrs, body, host, assembled=assembled)
