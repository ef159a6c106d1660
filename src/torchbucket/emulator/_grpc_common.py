"""What the emulator's gRPC handlers share: messages, errors, resources, handles.

Messages are google.storage.v2's (and google.storage.control.v2's), the raw
protobuf classes behind google-cloud-storage's proto-plus types (``Type.pb()``),
so a chunk of object data is serialized by protobuf's C code with no wrapper
in between. Errors carry a gRPC status code; GCS's HTTP statuses map onto the
codes as google.rpc.Code documents their HTTP equivalents (400
INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409
ABORTED for a conflict, 412 FAILED_PRECONDITION, 416 OUT_OF_RANGE, 429
RESOURCE_EXHAUSTED, 499 CANCELLED, 500 INTERNAL, 501 UNIMPLEMENTED, 503
UNAVAILABLE, 504 DEADLINE_EXCEEDED); google-cloud-storage's retry predicates
(``google.cloud.storage.asyncio``) retry INTERNAL, UNAVAILABLE,
DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED, as Google's retry strategy retries
500, 503, 504 and 429 over HTTP.
"""

from __future__ import annotations

import base64
from typing import Any

import grpc
from google.cloud._storage_v2.types import storage as _v2
from google.protobuf import empty_pb2

from torchbucket.emulator._model_object import ModelObject
from torchbucket.emulator._model_store import Preconditions
from torchbucket.emulator._zonal import AppendableObject

__all__ = [
    "CHUNK",
    "CODE_OF_STATUS",
    "STATUS_OF_CODE",
    "RpcError",
    "bucket_of",
    "make_handle",
    "object_proto",
    "pb",
    "preconditions",
    "read_handle_ok",
]

#: The largest data chunk in one message: google.storage.v2's
#: ServiceConstants.MAX_READ_CHUNK_BYTES and MAX_WRITE_CHUNK_BYTES (2 MiB).
CHUNK = 2 << 20


class _Messages:
    """The raw protobuf classes, by their google.storage.v2 names."""

    def __init__(self) -> None:
        names = (
            "Object",
            "Bucket",
            "GetObjectRequest",
            "GetBucketRequest",
            "ReadObjectRequest",
            "ReadObjectResponse",
            "BidiReadObjectRequest",
            "BidiReadObjectResponse",
            "WriteObjectRequest",
            "WriteObjectResponse",
            "BidiWriteObjectRequest",
            "BidiWriteObjectResponse",
            "ListObjectsRequest",
            "ListObjectsResponse",
            "DeleteObjectRequest",
        )
        for name in names:
            setattr(self, name, getattr(_v2, name).pb())
        self.Empty = empty_pb2.Empty

    def __getattr__(self, name: str) -> Any:  # for the type checker: every class is Any
        raise AttributeError(name)


pb = _Messages()

C = grpc.StatusCode
#: HTTP status (as the JSON API's handlers raise it) -> gRPC status code.
CODE_OF_STATUS: dict[int, grpc.StatusCode] = {
    400: C.INVALID_ARGUMENT,
    401: C.UNAUTHENTICATED,
    403: C.PERMISSION_DENIED,
    404: C.NOT_FOUND,
    405: C.UNIMPLEMENTED,
    408: C.DEADLINE_EXCEEDED,
    409: C.ABORTED,
    412: C.FAILED_PRECONDITION,
    416: C.OUT_OF_RANGE,
    429: C.RESOURCE_EXHAUSTED,
    499: C.CANCELLED,
    500: C.INTERNAL,
    501: C.UNIMPLEMENTED,
    502: C.UNAVAILABLE,
    503: C.UNAVAILABLE,
    504: C.DEADLINE_EXCEEDED,
}
#: gRPC status code -> the HTTP status the counters record (``by_status``).
STATUS_OF_CODE: dict[grpc.StatusCode, int] = {
    C.OK: 200,
    C.INVALID_ARGUMENT: 400,
    C.UNAUTHENTICATED: 401,
    C.PERMISSION_DENIED: 403,
    C.NOT_FOUND: 404,
    C.ALREADY_EXISTS: 409,
    C.ABORTED: 409,
    C.FAILED_PRECONDITION: 412,
    C.OUT_OF_RANGE: 416,
    C.RESOURCE_EXHAUSTED: 429,
    C.CANCELLED: 499,
    C.INTERNAL: 500,
    C.UNIMPLEMENTED: 501,
    C.UNAVAILABLE: 503,
    C.DEADLINE_EXCEEDED: 504,
}


class RpcError(Exception):
    """An RPC's failure: the status code and message the client gets."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        """The HTTP status the counters record for it."""
        return STATUS_OF_CODE.get(self.code, 500)


_BUCKET_PREFIX = "projects/_/buckets/"


def bucket_of(resource: str) -> str:
    """The bucket name in ``projects/_/buckets/NAME`` (google.storage.v2's form).

    Raises:
        RpcError: INVALID_ARGUMENT for any other form.
    """
    if not resource.startswith(_BUCKET_PREFIX) or len(resource) == len(_BUCKET_PREFIX):
        raise RpcError(
            C.INVALID_ARGUMENT, f"bucket must be projects/_/buckets/NAME, got {resource!r}"
        )
    return resource[len(_BUCKET_PREFIX) :]


def preconditions(msg: Any) -> Preconditions:
    """The generation preconditions of a request or spec (its optional fields)."""

    def opt(field: str) -> int | None:
        try:
            return int(getattr(msg, field)) if msg.HasField(field) else None
        except ValueError:  # the message has no such field
            return None

    return Preconditions(
        opt("if_generation_match"),
        opt("if_generation_not_match"),
        opt("if_metageneration_match"),
        opt("if_metageneration_not_match"),
    )


def object_proto(obj: ModelObject, *, zonal: bool) -> Any:
    """``obj`` as a google.storage.v2 ``Object`` (size and checksums of what is persisted).

    Times: a generation is the creation time in microseconds (as GCS makes
    them, and as ``ModelStore.new_generation`` does). An unfinalized
    appendable object has no ``finalize_time``; google-cloud-storage's
    readers tell a finalized object by it (``finalize_time.seconds > 0``).
    """
    out = pb.Object()
    out.name = obj.name
    out.bucket = _BUCKET_PREFIX + obj.bucket
    out.generation = obj.generation
    out.metageneration = obj.metageneration
    out.storage_class = "RAPID" if zonal else "STANDARD"
    out.size = obj.size if isinstance(obj, AppendableObject) else len(obj.data)
    out.content_type = obj.content_type
    if obj.content_encoding:
        out.content_encoding = obj.content_encoding
    out.etag = obj.etag
    out.checksums.crc32c = int.from_bytes(base64.b64decode(obj.crc32c), "big")
    if obj.md5 is not None:
        out.checksums.md5_hash = base64.b64decode(obj.md5)
    out.create_time.FromMicroseconds(obj.generation)
    out.update_time.FromMicroseconds(obj.generation)
    if not isinstance(obj, AppendableObject):
        out.finalize_time.FromMicroseconds(obj.generation)
    elif obj.finalized:
        out.finalize_time.FromNanoseconds(int(obj.finalize_time * 1e9))
    if obj.metadata:
        out.metadata.update(obj.metadata)
    if obj.component_count is not None:
        out.component_count = obj.component_count
    return out


def make_handle(kind: bytes, obj: ModelObject) -> bytes:
    """An opaque read or write handle naming ``obj`` (its bucket, name, generation)."""
    return b"%s:%s\0%s\0%d" % (kind, obj.bucket.encode(), obj.name.encode(), obj.generation)


def read_handle_ok(kind: bytes, handle: bytes, bucket: str, name: str) -> int | None:
    """The generation a handle of ``kind`` names for ``bucket``/``name``, or ``None``."""
    prefix = b"%s:%s\0%s\0" % (kind, bucket.encode(), name.encode())
    if not handle.startswith(prefix):
        return None
    try:
        return int(handle[len(prefix) :])
    except ValueError:
        return None
