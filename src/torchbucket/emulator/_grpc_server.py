"""The emulator's gRPC API: google.storage.v2 over the model store, with grpc.aio.

:class:`GrpcFront` serves ``google.storage.v2.Storage`` (``BidiReadObject``,
``ReadObject``, ``GetObject``, ``ListObjects``, ``BidiWriteObject``,
``WriteObject``, ``DeleteObject``, ``GetBucket``) and two calls of
``google.storage.control.v2.StorageControl`` (``GetStorageLayout``, which
gcsfs asks to tell a zonal bucket, and ``GetFolder``: ``_grpc_control``) on its own port, in the front server's
process and event loop, over the same store: what one API writes the other
reads. Every call goes through what an HTTP request goes through on the front
server: the auth mode's bearer token (metadata ``authorization``), the rps cap
and the request-rate model (429 as RESOURCE_EXHAUSTED, 503 as UNAVAILABLE),
fault rules, the latency model, and the counters, under the HTTP operation
names (a read stream is one ``get``, class B; a write stream one ``put``,
class A; ``GetObject`` a ``head``; ``ListObjects`` a ``list``; the layout and
bucket calls ``bucket_get``), with ``by_rpc`` counting the gRPC methods
(and ``BidiReadObject.ranges`` the ranges read on bidi streams).

Unserved methods answer UNIMPLEMENTED, as grpc does for an unknown method.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from torchbucket.emulator._faults import STATUS_KINDS, FaultRule
from torchbucket.emulator._grpc_common import CODE_OF_STATUS, RpcError, bucket_of, pb, preconditions
from torchbucket.emulator._http import ApiError, Route

if TYPE_CHECKING:
    from torchbucket.emulator._model_store import ModelStore
    from torchbucket.emulator._server import FrontServer

__all__ = ["GrpcFront", "Tally"]

logger = logging.getLogger(__name__)

_SERVICE = "google.storage.v2.Storage"
_CONTROL = "google.storage.control.v2.StorageControl"
_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


@dataclass(slots=True)
class Tally:
    """What one RPC adds to the counters, filled in as it runs."""

    method: str
    stats: Any = None
    op: str = ""
    bucket: str = ""
    status: int = 200
    bytes_in: int = 0
    bytes_out: int = 0
    begun: bool = False  # counted as admitted: its bytes go to the counters at once

    def sent(self, nbytes: int) -> None:
        """``nbytes`` answered: in the counters at once once the call is admitted."""
        if self.begun:
            self.stats.add_bytes(0, nbytes, self.bucket)
        else:
            self.bytes_out += nbytes

    def received(self, nbytes: int) -> None:
        """``nbytes`` received: in the counters at once once the call is admitted."""
        if self.begun:
            self.stats.add_bytes(nbytes, 0, self.bucket)
        else:
            self.bytes_in += nbytes


Unary = Callable[[Any, Any, Tally], Awaitable[Any]]
Streaming = Callable[[Any, Any, Tally], AsyncIterator[Any]]


class GrpcFront:
    """The gRPC server beside a :class:`FrontServer` on the model store.

    Args:
        front: The front server: its store, stats, faults, latency and auth.
    """

    def __init__(self, front: FrontServer) -> None:
        store = getattr(front.backend, "store", None)
        if store is None:
            raise ValueError("the gRPC API needs the model store (--backend model)")
        self.front = front
        self.store: ModelStore = store
        #: (bucket, name, generation) -> the token of the write stream that
        #: owns an appendable object now (a takeover moves it).
        self.owners: dict[tuple[str, str, int], int] = {}
        self._server: Any = None
        self.port = 0

    async def start(self, port: int = 0, *, tls: tuple[bytes, bytes] | None = None) -> int:
        """Listen on 127.0.0.1:``port`` (0: a free one); return the port.

        Args:
            port: The port.
            tls: ``(private key PEM, certificate chain PEM)`` to serve TLS.
        """
        from torchbucket.emulator._grpc_control import GET_FOLDER, GET_STORAGE_LAYOUT, ControlApi
        from torchbucket.emulator._grpc_read import ReadApi
        from torchbucket.emulator._grpc_write import WriteApi

        reads, writes = ReadApi(self), WriteApi(self)
        u, s = self._unary, self._streaming
        storage = {
            "GetObject": u("GetObject", reads.get_object, pb.GetObjectRequest, pb.Object),
            "ListObjects": u(
                "ListObjects", reads.list_objects, pb.ListObjectsRequest, pb.ListObjectsResponse
            ),
            "ReadObject": s(
                "ReadObject", reads.read_object, pb.ReadObjectRequest, pb.ReadObjectResponse, False
            ),
            "BidiReadObject": s(
                "BidiReadObject",
                reads.bidi_read,
                pb.BidiReadObjectRequest,
                pb.BidiReadObjectResponse,
                True,
            ),
            "DeleteObject": u("DeleteObject", self._delete, pb.DeleteObjectRequest, pb.Empty),
            "GetBucket": u("GetBucket", self._get_bucket, pb.GetBucketRequest, pb.Bucket),
            "WriteObject": self._client_streaming(
                "WriteObject", writes.write_object, pb.WriteObjectRequest, pb.WriteObjectResponse
            ),
            "BidiWriteObject": s(
                "BidiWriteObject",
                writes.bidi_write,
                pb.BidiWriteObjectRequest,
                pb.BidiWriteObjectResponse,
                True,
            ),
        }
        control_api = ControlApi(self)
        control = {
            "GetStorageLayout": u("GetStorageLayout", control_api.layout, *GET_STORAGE_LAYOUT),
            "GetFolder": u("GetFolder", control_api.get_folder, *GET_FOLDER),
        }
        server = grpc.aio.server(options=_OPTIONS)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(_SERVICE, storage),
                grpc.method_handlers_generic_handler(_CONTROL, control),
            )
        )
        address = f"127.0.0.1:{port}"
        if tls is not None:
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
        else:
            bound = server.add_insecure_port(address)
        await server.start()
        self._server = server
        self.port = int(bound)
        return self.port

    async def close(self) -> None:
        """Stop serving (streams in flight are cancelled)."""
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None

    # -- what every call goes through --------------------------------------

    async def admit(
        self, context: Any, tally: Tally, op: str, bucket: str, name: str
    ) -> FaultRule | None:
        """Auth, rate limits and fault rules for one call (or one range of a stream).

        Returns:
            A fault rule the caller applies to its data (``truncate``,
            ``corrupt``, ``corrupt_request``, ``stall_answer``), or ``None``.

        Raises:
            RpcError: The call is refused (or fails by an injected fault).
        """
        front = self.front
        tally.op, tally.bucket = tally.op or op, tally.bucket or bucket
        stats = front.stats
        if not tally.begun:
            # Counted now, not when the stream ends (see _stats.Stats.begin).
            stats.begin(tally.op, tally.bucket)
            stats.add_bytes(tally.bytes_in, tally.bytes_out, tally.bucket)
            tally.begun = True
        if front.auth is not None:
            headers = {}
            for key, value in context.invocation_metadata() or ():
                if key == "authorization":
                    headers["Authorization"] = value
            refused = front.auth.check(headers, Route(op, op, bucket, name))
            if refused is not None:
                try:
                    message = json.loads(refused.body)["error"]["message"]  # type: ignore[arg-type]
                except (ValueError, KeyError, TypeError):
                    message = "request refused"
                raise RpcError(
                    CODE_OF_STATUS.get(refused.status, grpc.StatusCode.UNAUTHENTICATED), message
                )
        if front.rate_cap is not None and front.rate_cap.take():
            stats.throttled += 1
            raise RpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "The rate of requests exceeds the emulator's rps cap.",
            )
        if front.rate_model is not None:
            status = front.rate_model.check(op, name)
            if status:
                stats.throttled += 1
                raise RpcError(
                    CODE_OF_STATUS[status], "The bucket's modelled request rate is exceeded."
                )
        return await self.fault(op, bucket, name)

    async def fault(self, op: str, bucket: str, name: str) -> FaultRule | None:
        """Count one request of ``op`` against the fault rules; apply what fires.

        A bidi read's open and each range it reads are one request each.

        Returns:
            The rule whose fault the caller applies to its data, or ``None``.

        Raises:
            RpcError: A status fault, a reset, or a stall's end.
        """
        front = self.front
        rule = front.faults.check(op, name or bucket) if front.faults.rules else None
        if rule is None:
            return None
        front.stats.faults[rule.kind] += 1
        kind = rule.kind
        if kind in STATUS_KINDS:
            await self.first_byte(op)
            raise RpcError(CODE_OF_STATUS[int(kind)], f"Injected fault: {kind}.")
        if kind == "reset":
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "Connection reset (injected fault).")
        if kind == "stall":
            await asyncio.sleep(rule.stall_seconds)
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "Stream stalled (injected fault).")
        if kind == "stall_apply":
            await asyncio.sleep(rule.stall_seconds)
            return None
        return rule

    async def first_byte(self, op: str) -> None:
        """Sleep the latency model's time to the first byte of ``op``."""
        sampler = getattr(self.front, "_sampler", None)
        if sampler is not None:
            before, after = sampler.first_byte_split(op)
            if sampler.last_stall is not None:
                self.front.stats.stalls[f"{op}:{sampler.last_stall}"] += 1
            if before + after:
                await asyncio.sleep(before + after)

    async def transfer(self, nbytes: int) -> None:
        """Sleep ``nbytes``' transfer time at the modelled bandwidth."""
        sampler = getattr(self.front, "_sampler", None)
        if sampler is not None and sampler.model.bandwidth is not None and nbytes:
            await asyncio.sleep(nbytes / sampler.model.bandwidth)

    def _count(self, tally: Tally) -> None:
        if tally.begun:
            self.front.stats.by_status[tally.status] += 1
        elif tally.op:
            self.front.stats.count(
                tally.op, tally.status, tally.bytes_in, tally.bytes_out, tally.bucket
            )

    def _begin(self, method: str) -> Tally:
        self.front.stats.by_rpc[method] += 1
        return Tally(method, self.front.stats)

    # -- handler wrappers ----------------------------------------------------

    def _unary(self, method: str, fn: Unary, req_cls: Any, resp_cls: Any) -> Any:
        async def handler(request: Any, context: Any) -> Any:
            tally = self._begin(method)
            try:
                return await fn(request, context, tally)
            except (RpcError, ApiError) as exc:
                code, message, tally.status = _failure(exc)
                await context.abort(code, message)
            except asyncio.CancelledError:
                tally.status = 499
                raise
            finally:
                self._count(tally)

        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=req_cls.FromString, response_serializer=_serialize
        )

    def _client_streaming(self, method: str, fn: Unary, req_cls: Any, resp_cls: Any) -> Any:
        unary = self._unary(method, fn, req_cls, resp_cls)
        return grpc.stream_unary_rpc_method_handler(
            unary.unary_unary,
            request_deserializer=req_cls.FromString,
            response_serializer=_serialize,
        )

    def _streaming(
        self, method: str, fn: Streaming, req_cls: Any, resp_cls: Any, bidi: bool
    ) -> Any:
        async def handler(request: Any, context: Any) -> AsyncIterator[Any]:
            tally = self._begin(method)
            try:
                async for response in fn(request, context, tally):
                    yield response
            except (RpcError, ApiError) as exc:
                code, message, tally.status = _failure(exc)
                await context.abort(code, message)
            except asyncio.CancelledError:
                tally.status = 499
                raise
            finally:
                self._count(tally)

        make = (
            grpc.stream_stream_rpc_method_handler if bidi else grpc.unary_stream_rpc_method_handler
        )
        return make(
            handler, request_deserializer=req_cls.FromString, response_serializer=_serialize
        )

    # -- small calls ---------------------------------------------------------

    async def _delete(self, request: Any, context: Any, tally: Tally) -> Any:
        bucket = bucket_of(request.bucket)
        await self.admit(context, tally, "delete", bucket, request.object_)
        await self.first_byte("delete")
        self.store.delete(
            bucket, request.object_, request.generation or None, preconditions(request)
        )
        return pb.Empty()

    async def _get_bucket(self, request: Any, context: Any, tally: Tally) -> Any:
        name = bucket_of(request.name)
        await self.admit(context, tally, "bucket_get", name, "")
        await self.first_byte("bucket_get")
        found = self.store.bucket(name)
        out = pb.Bucket()
        out.name = request.name
        out.bucket_id = name
        out.location = "US-CENTRAL1"
        out.location_type = "zone" if found.zonal else "region"
        out.storage_class = "RAPID" if found.zonal else "STANDARD"
        out.hierarchical_namespace.enabled = bool(found.zonal)
        return out


def _serialize(message: Any) -> bytes:
    if type(message) is bytes:
        return message  # serialized already (a read's data, see _grpc_read.range_message)
    return bytes(message.SerializeToString())


def _failure(exc: RpcError | ApiError) -> tuple[grpc.StatusCode, str, int]:
    """(code, message, HTTP status for the counters) of a failed call."""
    if isinstance(exc, RpcError):
        return exc.code, exc.message, exc.status
    return CODE_OF_STATUS.get(exc.status, grpc.StatusCode.INTERNAL), exc.message, exc.status
