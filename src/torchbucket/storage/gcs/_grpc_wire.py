"""google.storage.v2 over ``grpc.aio``: the channel, the messages, the error mapping.

The gRPC path (zonal buckets, and any bucket where ``GCSConfig.transport`` asks
for it) speaks Google's public ``google.storage.v2`` API with ``grpc.aio`` and
the raw protobuf classes of google-cloud-storage's generated
``google.cloud._storage_v2`` (``Message.pb()``: no proto-plus wrapper per
message). Why not ``google.cloud.storage.asyncio``: see docs/architecture.md,
"The gRPC path".

Channels do not survive ``fork`` (gcsfs documents that its Rapid path needs
``spawn``): a channel belongs to the process and the event loop that made it,
and a DataLoader worker (another pid, another loop) makes its own on first use,
never touching the parent's.

Status codes map onto :mod:`torchbucket.errors` here and nowhere else, after
Google's retry strategy for gRPC (https://cloud.google.com/storage/docs/retry-strategy):
``UNAVAILABLE``, ``INTERNAL``, ``DEADLINE_EXCEEDED`` and ``RESOURCE_EXHAUSTED``
are retried (the last as throttling), as is ``ABORTED`` on a read (a redirect,
or a stream the server ended); ``DATA_LOSS`` is a checksum refused.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

from torchbucket.errors import (
    BucketNotFoundError,
    IntegrityError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.storage.gcs._grpc_data import read_response, serialize
from torchbucket.storage.gcs._layout import grpc_target

# GRPC_ENABLE_FORK_SUPPORT is set before this import: see the package's __init__.
try:
    import grpc
    from google.cloud import _storage_v2 as _v2
except ImportError:  # pragma: no cover - the rapid extra is missing
    grpc = None  # type: ignore[assignment]
    _v2 = None  # type: ignore[assignment]

#: What ``call.read()`` returns at the end of a stream.
EOF = grpc.aio.EOF if grpc is not None else object()

__all__ = [
    "CHUNK_LIMIT",
    "EOF",
    "Channels",
    "available",
    "bucket_path",
    "error_for_rpc",
    "error_for_status",
    "error_of_call",
    "grpc_target",
    "hold",
    "inherited",
    "pb",
]

#: Most bytes one ``ChecksummedData`` may carry (GCS's ``MAX_WRITE_CHUNK_BYTES``).
CHUNK_LIMIT = 2 << 20
_SERVICE = "/google.storage.v2.Storage/"
#: gRPC's default 4 MiB receive cap is too small for 2 MiB chunks plus framing
#: on some servers; Google's clients raise it the same way.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.keepalive_time_ms", 60_000),
]


# The process that opened a channel: a forked child of it must not use gRPC.
_used_pid: int | None = None


def inherited() -> bool:
    """Whether gRPC was used by a process this one was forked from."""
    return _used_pid is not None and _used_pid != os.getpid()


# Every object that holds gRPC state (channels, calls), and, in a forked
# child, strong references to what the parent had. gRPC's objects must never
# be freed in a child (their destructors reach threads the fork did not copy,
# and the child crashes), so a fork pins them, and with them the parent's
# loop, whose callbacks hold gRPC's poller: the child holds them, unused,
# until it exits.
_holders: weakref.WeakSet[Any] = weakref.WeakSet()
_pinned: list[Any] = []


def hold(obj: Any) -> None:
    """Have ``obj`` (and what it references) outlive a fork in the child."""
    _holders.add(obj)


def _pin_before_fork() -> None:
    if _used_pid == os.getpid():
        _pinned.append(list(_holders))


def _unpin_in_parent() -> None:
    if _pinned and _used_pid == os.getpid():
        _pinned.pop()


os.register_at_fork(before=_pin_before_fork, after_in_parent=_unpin_in_parent)


def available() -> bool:
    """Whether ``grpcio`` and google-cloud-storage's v2 messages are installed."""
    return grpc is not None and _v2 is not None


def _missing() -> StorageError:
    return StorageError(
        "the gRPC path needs grpcio and google-cloud-storage>=3.9: "
        "pip install 'torchbucket[rapid]'",
        operation="connect",
    )


class _Pb:
    """The raw protobuf classes of google.storage.v2, looked up once."""

    def __init__(self) -> None:
        if _v2 is None:
            raise _missing()
        for name in (
            "BidiReadObjectRequest",
            "BidiReadObjectResponse",
            "BidiReadObjectSpec",
            "BidiReadObjectRedirectedError",
            "BidiWriteObjectRequest",
            "BidiWriteObjectResponse",
            "BidiWriteObjectRedirectedError",
            "GetObjectRequest",
            "DeleteObjectRequest",
            "Object",
            "ReadRange",
        ):
            setattr(self, name, getattr(_v2, name).pb())
        self.Empty = __import__("google.protobuf.empty_pb2", fromlist=["Empty"]).Empty


_pb: _Pb | None = None


def pb() -> Any:
    """The message classes (:class:`_Pb`), loaded on first use."""
    global _pb
    if _pb is None:
        _pb = _Pb()
    return _pb


def bucket_path(bucket: str) -> str:
    """The v2 name of a bucket: ``projects/_/buckets/{bucket}``."""
    return f"projects/_/buckets/{bucket}"


class Channels:
    """The gRPC channel of one endpoint for the running process and loop.

    Args:
        target: ``host:port``.
        secure: TLS (Google's endpoint) or plaintext (an emulator).
        bucket: Sent as the routing header every v2 call needs.
    """

    def __init__(self, target: str, *, secure: bool, bucket: str) -> None:
        self.target = target
        self.secure = secure
        self.routing = ("x-goog-request-params", f"bucket={bucket_path(bucket)}")
        self._state: tuple[int, asyncio.AbstractEventLoop, Any, dict[str, Any]] | None = None
        hold(self)

    def _open(self) -> tuple[int, asyncio.AbstractEventLoop, Any, dict[str, Any]]:
        if grpc is None:
            raise _missing()
        global _used_pid
        if inherited():
            raise StorageError(
                "gRPC was used before this process was forked, and does not survive fork",
                operation="connect",
            )
        m = pb()
        _used_pid = os.getpid()
        if self.secure:
            channel = grpc.aio.secure_channel(
                self.target, grpc.ssl_channel_credentials(), options=_CHANNEL_OPTIONS
            )
        else:
            channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        methods = {
            "BidiReadObject": channel.stream_stream(
                _SERVICE + "BidiReadObject",
                request_serializer=m.BidiReadObjectRequest.SerializeToString,
                # Range data parsed by hand, its chunks not copied (see _grpc_data).
                response_deserializer=read_response(m.BidiReadObjectResponse),
            ),
            "BidiWriteObject": channel.stream_stream(
                _SERVICE + "BidiWriteObject",
                # Data messages come serialized (see _grpc_data); others as messages.
                request_serializer=serialize,
                response_deserializer=m.BidiWriteObjectResponse.FromString,
            ),
            "GetObject": channel.unary_unary(
                _SERVICE + "GetObject",
                request_serializer=m.GetObjectRequest.SerializeToString,
                response_deserializer=m.Object.FromString,
            ),
            "DeleteObject": channel.unary_unary(
                _SERVICE + "DeleteObject",
                request_serializer=m.DeleteObjectRequest.SerializeToString,
                response_deserializer=m.Empty.FromString,
            ),
        }
        return (os.getpid(), asyncio.get_running_loop(), channel, methods)

    def method(self, name: str) -> Any:
        """The callable of RPC ``name`` on this process's and loop's channel."""
        state = self._state
        if state is None or state[0] != os.getpid() or state[1] is not asyncio.get_running_loop():
            # A forked child or another loop: a channel of its own. The
            # parent's is left alone (closing it here could block on threads
            # that did not survive the fork).
            if state is not None and state[0] != os.getpid():
                _pinned.append(state)  # the parent's: never freed here
            state = self._state = self._open()
        return state[3][name]

    async def close(self) -> None:
        """Close this loop's channel, if it made one."""
        state = self._state
        if state is not None and state[0] == os.getpid() and state[1] is asyncio.get_running_loop():
            self._state = None
            await state[2].close()


#: gRPC status code name -> (error type, HTTP status it stands for).
_CODES: dict[str, tuple[type[StorageError], int]] = {
    "NOT_FOUND": (NotFoundError, 404),
    "PERMISSION_DENIED": (PermissionDeniedError, 403),
    "UNAUTHENTICATED": (PermissionDeniedError, 401),
    "FAILED_PRECONDITION": (PreconditionFailedError, 412),
    "ALREADY_EXISTS": (PreconditionFailedError, 412),
    "RESOURCE_EXHAUSTED": (ThrottledError, 429),
    "UNAVAILABLE": (TransientError, 503),
    "INTERNAL": (TransientError, 500),
    "DEADLINE_EXCEEDED": (TransientError, 504),
    "ABORTED": (TransientError, 409),
    "DATA_LOSS": (IntegrityError, 400),
    "CANCELLED": (TransientError, 499),
    # A range that starts past the end of the object (HTTP's 416).
    "OUT_OF_RANGE": (StorageError, 416),
    "UNKNOWN": (TransientError, 500),
}


def error_for_rpc(
    exc: BaseException, *, operation: str, uri: str, bucket_op: bool = False
) -> StorageError:
    """The :mod:`torchbucket.errors` type of a failed RPC (or broken stream)."""
    code = getattr(exc, "code", None)
    name = code().name if callable(code) else ""
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)  # type: ignore[attr-defined]
    return error_for_status(
        name or type(exc).__name__, details, operation=operation, uri=uri, bucket_op=bucket_op
    )


async def error_of_call(call: Any, exc: BaseException, *, operation: str, uri: str) -> StorageError:
    """:func:`error_for_rpc`, or, for a write to a call that has ended (asyncio's
    ``InvalidStateError``), the error of the status it ended with."""
    if isinstance(exc, asyncio.InvalidStateError) and call is not None:
        try:
            code = await call.code()
            details = await call.details()
        except Exception:  # no status to be had: the stream ended, that is all
            return TransientError("the stream ended", operation=operation, uri=uri)
        return error_for_status(code.name, details, operation=operation, uri=uri)
    return error_for_rpc(exc, operation=operation, uri=uri)


def error_for_status(
    name: str, details: str | None, *, operation: str, uri: str, bucket_op: bool = False
) -> StorageError:
    """The :mod:`torchbucket.errors` type of gRPC status ``name`` (``"NOT_FOUND"``...)."""
    message = f"gRPC {name or 'error'}: {(details or '')[:300]}"
    cls, status = _CODES.get(name, (StorageError, 400))
    if cls is NotFoundError and bucket_op:
        cls = BucketNotFoundError
    return cls(message, operation=operation, uri=uri, status=status)
