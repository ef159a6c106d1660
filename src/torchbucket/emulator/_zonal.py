"""Zonal (Rapid) buckets of the model store: appendable objects and what they refuse.

A zonal bucket (``ModelBucket.zonal``) holds appendable objects, written over
gRPC's ``BidiWriteObject`` (``_grpc_write``), readable while they grow and
finalized once. As on GCS, such a bucket has no compose, no copy or rewrite and
no XML multipart uploads (https://cloud.google.com/storage/docs/rapid/rapid-bucket
lists what zonal buckets support; gcsfs 2026.x refuses copy and compose on them
for the same reason: "Zonal objects do not support rewrite"). Google documents
no error body for these refusals; the emulator answers 400 (JSON reason
``invalid``, XML ``InvalidArgument``): a request this bucket can never serve, not
one to retry.

An :class:`AppendableObject` is a :class:`ModelObject` whose bytes grow by
flushes: they are kept as a list of chunks and joined only when a reader asks
for ``data`` (a checkpoint written in 16 MiB flushes costs one join at the end,
not one per flush), and its CRC32C is extended chunk by chunk.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from torchbucket.emulator._http import ApiError, Route, error_response, rfc3339
from torchbucket.emulator._model_object import ModelObject

if TYPE_CHECKING:
    from torchbucket.emulator._model_store import ModelStore, Preconditions

__all__ = [
    "ZONAL_REFUSED_OPS",
    "AppendableObject",
    "check_zonal",
    "create_appendable",
    "is_zonal",
    "zonal_refusal",
]

#: HTTP operations a zonal bucket refuses: compose, copy/rewrite, and the XML
#: multipart upload (refused at its start, so no part is ever stored).
ZONAL_REFUSED_OPS = {
    "compose": "compose",
    "copy": "copy and rewrite",
    "mpu_initiate": "XML multipart uploads",
}


def is_zonal(backend: Any, bucket: str | None) -> bool:
    """Whether ``bucket`` is a zonal bucket of ``backend``'s model store."""
    store = getattr(backend, "store", None)
    if store is None or not bucket:
        return False
    found = store.buckets.get(bucket)
    return found is not None and bool(found.zonal)


def zonal_refusal(backend: Any, route: Route) -> web.Response | None:
    """GCS's refusal of ``route`` on a zonal bucket, or ``None`` when it is allowed."""
    what = ZONAL_REFUSED_OPS.get(route.op)
    if what is None:
        return None
    for bucket in (route.bucket, route.bucket2):
        if is_zonal(backend, bucket):
            return error_response(
                400,
                f"Zonal bucket {bucket} does not support {what} (Rapid storage).",
                xml=route.xml,
                reason="invalid",
                xml_code="InvalidArgument",
            )
    return None


def crc32c_b64_of(value: int) -> str:
    """A CRC32C value as GCS writes it: base64 of its 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


class AppendableObject(ModelObject):
    """An appendable object: persisted bytes that grow until it is finalized.

    Attributes:
        finalized: Whether the object is finalized (no more appends).
        finalize_time: When it was, seconds since the epoch (0 until then).
        crc_value: CRC32C of the persisted bytes, as an integer.
    """

    __slots__ = ("_chunks", "_size", "crc_value", "finalize_time", "finalized")

    def __init__(self, bucket: str, name: str, generation: int, **kwargs: Any) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        super().__init__(bucket, name, b"", generation, rfc3339(time.time()), md5=False, **kwargs)
        self.crc_value = 0
        self.finalized = False
        self.finalize_time = 0.0

    @property  # type: ignore[override]
    def data(self) -> bytes:
        """The persisted bytes (joined once after each append)."""
        chunks = self._chunks
        if len(chunks) != 1:
            joined = b"".join(chunks)
            self._chunks = [joined]
            return joined
        return chunks[0]

    @data.setter
    def data(self, value: bytes) -> None:
        self._chunks = [value]
        self._size = len(value)

    @property
    def size(self) -> int:
        """How many bytes are persisted (no join)."""
        return self._size

    def append(self, chunks: list[bytes], crc_value: int) -> None:
        """Persist ``chunks`` after the current bytes; ``crc_value`` covers them all."""
        if not chunks:
            return
        self._chunks.extend(chunks)
        self._size += sum(len(c) for c in chunks)
        self.crc_value = crc_value
        self.crc32c = crc32c_b64_of(crc_value)
        self.invalidate()

    def finalize(self) -> None:
        """No more appends from now on."""
        self.finalized = True
        self.finalize_time = time.time()
        self.invalidate()


def create_appendable(
    store: ModelStore,
    bucket: str,
    name: str,
    *,
    pre: Preconditions,
    content_type: str | None,
    metadata: dict[str, str] | None,
) -> AppendableObject:
    """Create an empty appendable object ``name`` (a new generation) in ``bucket``.

    It replaces a live object of that name, as any write does, once ``pre``
    holds; it is visible at once (size 0) over both APIs.

    Raises:
        ApiError: 404 without the bucket, 412 when ``pre`` fails.
    """
    placeholder = store.put(bucket, name, b"", pre=pre, md5=False)
    obj = AppendableObject(
        bucket,
        name,
        placeholder.generation,
        content_type=content_type or "application/octet-stream",
        metadata=metadata,
    )
    store.bucket(bucket).objects[name] = obj  # same name: the sorted key list stands
    return obj


def check_zonal(store: ModelStore, bucket: str) -> None:
    """Raise 400 unless ``bucket`` is a zonal bucket (appendable objects live only there)."""
    if not store.bucket(bucket).zonal:
        raise ApiError(
            400, f"Appendable objects are supported only in zonal buckets; {bucket} is not one."
        )
