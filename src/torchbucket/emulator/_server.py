"""The front server: one aiohttp server on 127.0.0.1 in front of either store.

Per request it parses the route once, applies the requests-per-second cap and
the fault rules, hands the call to the XML API, the permission check or the
backend (the model store in this process, or a proxy to fake-gcs-server),
sleeps the modelled latency and counts the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import ssl
import struct
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from torchbucket.emulator._admin import admin_refused, admin_token_ok, handle_admin
from torchbucket.emulator._faults import STATUS_KINDS, FaultRule, FaultTable, flip_byte
from torchbucket.emulator._http import Call, Route, error_response, json_call, json_response
from torchbucket.emulator._latency import LatencyModel, LatencySampler, RateCap
from torchbucket.emulator._names import name_problem, written_name
from torchbucket.emulator._pieces import PiecesPayload
from torchbucket.emulator._ratemodel import RateState, RequestRateModel
from torchbucket.emulator._routes import parse_route
from torchbucket.emulator._stats import Stats
from torchbucket.emulator._xml_multipart import XmlApi
from torchbucket.emulator._zonal import ZONAL_REFUSED_OPS, zonal_refusal

if TYPE_CHECKING:
    from torchbucket.emulator._auth import AuthState

__all__ = ["Backend", "FrontServer"]

logger = logging.getLogger(__name__)

# Large uploads (a resumable chunk, a multipart part) are read whole.
_CLIENT_MAX_SIZE = 1 << 36
# Bodies above this size are streamed at the modelled bandwidth.
_STREAM_THRESHOLD = 4 << 20
_STREAM_CHUNK = 1 << 20
_STATUS_FAULTS = {kind: int(kind) for kind in STATUS_KINDS}
_FAULT_MESSAGES = {
    403: "Permission denied (injected fault).",
    404: "Not found (injected fault).",
    405: "Method not allowed (injected fault).",
    408: "Request timeout (injected fault).",
    429: "The rate of requests is too high (injected fault).",
    500: "Internal error (injected fault).",
    501: "Not implemented (injected fault).",
    502: "Bad gateway (injected fault).",
    503: "Service unavailable (injected fault).",
    504: "Gateway timeout (injected fault).",
}


class Backend(Protocol):
    """A store behind the front server."""

    name: str
    pid: int | None

    async def start(self) -> None:
        """Start serving (launch a process, open sessions)."""
        ...

    async def close(self) -> None:
        """Stop serving."""
        ...

    async def handle(self, call: Call) -> web.Response:
        """Answer one JSON API call."""
        ...

    async def seed(self, bucket: str, items: Any) -> int:
        """Bulk-load ``(name, data)`` pairs; return how many."""
        ...

    async def object_names(self, bucket: str, prefix: str) -> list[str]:
        """Every object name under ``prefix``, sorted."""
        ...

    async def create_bucket(self, name: str) -> None:
        """Create a bucket."""
        ...


class FrontServer:
    """The front server's state and request path.

    Args:
        backend: The store.
        latency: The latency model, or ``None``.
        rps_cap: Requests per second above which the server answers 429.
        rate_model: GCS's request-rate behaviour (see ``_ratemodel``), or ``None``.
        min_part_size: Smallest XML multipart part but the last, bytes.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        latency: LatencyModel | None = None,
        rps_cap: float | None = None,
        rate_model: RequestRateModel | None = None,
        min_part_size: int = 0,
    ) -> None:
        self.backend = backend
        self._sampler: LatencySampler | None = None
        self.latency = latency
        self.rate_cap = RateCap(rps_cap) if rps_cap else None
        self.rate_model = RateState(rate_model) if rate_model is not None else None
        self.faults = FaultTable()
        self.stats = Stats()
        self.xml = XmlApi(backend, min_part_size=min_part_size)
        self._runner: web.ServerRunner | None = None
        self.port = 0
        self.stopped = asyncio.Event()
        # Set in "auth required" mode: requests need a token it issued.
        self.auth: AuthState | None = None
        # Set in that mode too: the admin API (/_emulator/...) needs this secret.
        self.admin_token: str | None = None

    @property
    def latency(self) -> LatencyModel | None:
        """The latency model in force, or ``None``."""
        return self._sampler.model if self._sampler is not None else None

    @latency.setter
    def latency(self, model: LatencyModel | None) -> None:
        # A new model starts its draws from its seed.
        self._sampler = LatencySampler(model) if model is not None else None

    async def start(self, port: int = 0, *, ssl_context: ssl.SSLContext | None = None) -> int:
        """Bind 127.0.0.1:``port`` (0: a free one) and serve; return the port.

        With ``ssl_context`` it serves HTTPS only.
        """
        loop = asyncio.get_running_loop()

        def make_request(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: RequestHandler,
            writer: Any,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=_CLIENT_MAX_SIZE
            )

        server = web.Server(self.handle, request_factory=make_request, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            "127.0.0.1",
            port,
            backlog=1024,
            reuse_address=True,
            ssl_context=ssl_context,
        )
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = int(sock.getsockname()[1])
        return self.port

    async def close(self) -> None:
        """Stop serving and stop the backend."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.backend.close()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request (the server's single entry point)."""
        raw = request.raw_path
        path = raw.partition("?")[0]
        if path.startswith("/_emulator/"):
            return await self._admin(request, path)
        query = request.query
        route = parse_route(request.method, path, query)
        op = route.op
        stats = self.stats
        turned_away = await self._turn_away(request, route)
        if turned_away is not None:
            return turned_away
        rule = self.faults.check(op, route.name or route.bucket) if self.faults.rules else None
        body = await _read_body(request)
        if rule is not None:
            stats.faults[rule.kind] += 1
            early = await self._early_fault(request, rule, route, len(body))
            if early is not None:
                return early
            if rule.kind == "corrupt_request":
                body = flip_byte(body)  # damaged on the way up; the answer is left alone
        if rule is not None and rule.kind == "stall_apply":
            await asyncio.sleep(rule.stall_seconds)  # held; applied afterwards all the same
        latency = self._sampler
        after = 0.0
        if latency is not None:
            before, after = latency.first_byte_split(op)
            if latency.last_stall is not None:
                stats.stalls[f"{op}:{latency.last_stall}"] += 1
            if before:
                await asyncio.sleep(before)  # a stall before the request is applied
        call = Call(
            request.method, route, raw, query, request.headers, body, request.host, request.scheme
        )
        resp = await self._apply(call)
        out_len = _body_size(resp)
        stats.count(op, resp.status, len(body), out_len, route.bucket)
        if latency is not None:
            bandwidth = latency.model.bandwidth
            if (
                bandwidth is not None
                and out_len > _STREAM_THRESHOLD
                and rule is None
                and request.method != "HEAD"
            ):
                # A big body flows at the modelled rate after the first byte,
                # so a client's read timeout sees steady progress, not silence.
                await asyncio.sleep(after + latency.transfer(len(body), 0))
                return await _stream(request, resp, bandwidth)
            await asyncio.sleep(after + latency.transfer(len(body), out_len))
        if rule is not None and rule.kind == "stall_answer":
            await asyncio.sleep(rule.stall_seconds)  # applied; its answer never comes
            _reset(request)
            return web.Response(status=500)
        if rule is not None and rule.kind not in ("corrupt_request", "stall_apply"):
            return await self._mangle(request, resp, rule.kind)
        return resp

    async def _admin(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        """Answer a request of the admin API (``/_emulator/...``)."""
        if self.admin_token is not None and not admin_token_ok(request, self.admin_token):
            return await admin_refused(request)
        if self.auth is not None and path.startswith("/_emulator/auth/"):
            return await self.auth.admin(request, path[len("/_emulator/auth/") :])
        return await handle_admin(self, request, path)

    async def _turn_away(self, request: web.BaseRequest, route: Route) -> web.StreamResponse | None:
        """The answer to a request refused before it is applied (no token, over a rate), if so."""
        op, stats = route.op, self.stats
        if self.auth is not None:
            refused = self.auth.check(request.headers, route)
            if refused is not None:
                if request.body_exists and "Expect" not in request.headers:
                    await request.read()
                stats.count(op, refused.status, 0, 0, route.bucket)
                return refused
        if self.rate_cap is not None:
            wait = self.rate_cap.take()
            if wait:
                stats.throttled += 1
                resp = error_response(
                    429,
                    "The rate of requests exceeds the emulator's rps cap.",
                    xml=route.xml,
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
                stats.count(op, 429, 0, 0, route.bucket)
                return resp
        if self.rate_model is not None:
            status = self.rate_model.check(op, route.name or "")
            if status:
                stats.throttled += 1
                stats.count(op, status, 0, 0, route.bucket)
                return error_response(
                    status, "The bucket's modelled request rate is exceeded.", xml=route.xml
                )
        return None

    async def _apply(self, call: Call) -> web.Response:
        """Apply the request: the XML API, IAM or the backend, unless its name or bucket refuse it."""
        route = call.route
        written = written_name(call)
        problem = name_problem(written) if written is not None else None
        refused = zonal_refusal(self.backend, route) if route.op in ZONAL_REFUSED_OPS else None
        if problem is not None:
            return error_response(400, problem, xml=route.xml)  # as GCS: reason "invalid"
        if refused is not None:
            return refused  # compose, rewrite, XML multipart on a zonal bucket
        if route.xml:
            return await self.xml.handle(call)
        if route.op == "iam":
            return await self._iam(call)
        return await self.backend.handle(call)

    async def _early_fault(
        self, request: web.BaseRequest, rule: FaultRule, route: Route, body_len: int
    ) -> web.StreamResponse | None:
        """Apply a fault that replaces the answer; ``None`` for body faults."""
        kind = rule.kind
        xml, op, bucket = route.xml, route.op, route.bucket
        status = _STATUS_FAULTS.get(kind)
        if status is not None:
            if op == "iam" and status == 403:
                # GCS answers a caller without the permissions with none of them.
                resp = json_response(b'{"kind":"storage#testIamPermissionsResponse"}')
            else:
                resp = error_response(status, _FAULT_MESSAGES[status], xml=xml)
            if self._sampler is not None:
                await asyncio.sleep(self._sampler.delay(op, body_len, 0))
            self.stats.count(op, resp.status, body_len, 0, bucket)
            return resp
        if kind == "reset":
            self.stats.count(op, 0, body_len, 0, bucket)
            _reset(request)
            return web.Response(status=500)
        if kind == "stall":
            self.stats.count(op, 0, body_len, 0, bucket)
            await asyncio.sleep(rule.stall_seconds)
            _reset(request)
            return web.Response(status=500)
        return None

    async def _mangle(
        self, request: web.BaseRequest, resp: web.Response, kind: str
    ) -> web.StreamResponse:
        """Apply a body fault (corrupt or truncate) to a computed answer."""
        raw = resp.body
        body = bytes(raw.pieces if isinstance(raw, PiecesPayload) else raw or b"")  # type: ignore[arg-type]
        if kind == "corrupt":
            if body:
                flipped = bytearray(body)
                flipped[len(flipped) // 2] ^= 0xFF
                resp.body = bytes(flipped)
            return resp
        # truncate: announce the full length, send half of it, close.
        out = web.StreamResponse(status=resp.status, reason=resp.reason)
        out.headers.update(resp.headers)
        out.content_length = len(body) or 16
        await out.prepare(request)
        if len(body) > 1:
            await out.write(body[: len(body) // 2])
        transport = request.transport
        if transport is not None:
            transport.close()
        return out

    async def _iam(self, call: Call) -> web.Response:
        """``testIamPermissions``: every permission asked for is granted."""
        resp = await self.backend.handle(
            json_call("GET", "bucket_get", call.route.bucket, host=call.host)
        )
        if resp.status >= 400:
            return resp
        getall = getattr(call.query, "getall", None)
        perms: list[str] = list(getall("permissions", [])) if getall else []
        payload: dict[str, Any] = {"kind": "storage#testIamPermissionsResponse"}
        if perms:
            payload["permissions"] = perms
        return json_response(json.dumps(payload).encode())


async def _stream(
    request: web.BaseRequest, resp: web.Response, bandwidth: float
) -> web.StreamResponse:
    """Send ``resp``'s body in chunks, each after its share of transfer time."""
    raw = resp.body
    if isinstance(raw, PiecesPayload):
        pieces = [memoryview(c) for c in raw.pieces.chunks]
    else:
        pieces = [memoryview(raw if isinstance(raw, (bytes, bytearray, memoryview)) else b"")]
    out = web.StreamResponse(status=resp.status, reason=resp.reason)
    out.headers.update(resp.headers)
    if resp.chunked:  # a transcoded download: no Content-Length, as on GCS
        out.enable_chunked_encoding()
    else:
        out.content_length = sum(len(p) for p in pieces)
    await out.prepare(request)
    for body in pieces:
        for start in range(0, len(body), _STREAM_CHUNK):
            chunk = body[start : start + _STREAM_CHUNK]
            await asyncio.sleep(len(chunk) / bandwidth)
            await out.write(chunk)
    await out.write_eof()
    return out


def _body_size(resp: web.Response) -> int:
    """The length of ``resp``'s body (bytes, or an object's pieces)."""
    raw = resp.body
    if raw is None:
        return 0
    if isinstance(raw, PiecesPayload):
        return len(raw.pieces)
    return len(raw)  # type: ignore[arg-type]


async def _read_body(request: web.BaseRequest) -> bytes:
    """The request's body (``b""`` for none), a ``100 Continue`` sent first if asked for."""
    if not request.body_exists:
        return b""
    if request.headers.get("Expect", "").lower() == "100-continue":
        # The low-level server leaves this to the handler (curl waits a second otherwise).
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    # Not request.read(): it grows a bytearray chunk by chunk and copies that
    # into bytes at the end, two to three copies of every uploaded byte, the
    # largest share of the emulator's CPU in a multipart save (a py-spy
    # profile of 512 MiB saves: 38%). Joined once here, a body costs one copy.
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > _CLIENT_MAX_SIZE:
            raise web.HTTPRequestEntityTooLarge(max_size=_CLIENT_MAX_SIZE, actual_size=size)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _reset(request: web.BaseRequest) -> None:
    """Close the connection abruptly: an RST, not a FIN, where possible."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()
