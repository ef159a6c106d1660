"""``dataflux_pytorch.multipart_upload.multipart``, on torchbucket's checkpoint writer.

dataflux's ``upload_chunks_concurrently_from_bytesio(bytesio, blob)`` takes a
``google.cloud.storage`` ``Blob``; here ``blob`` is a ``gs://`` / ``gcs://``
URI, or any object with ``.name`` and ``.bucket.name`` (a ``Blob`` included:
only its names are used). The upload is torchbucket's parallel multipart
upload (the XML multipart API on GCS), with a CRC32C check of the whole object.
"""

from __future__ import annotations

import io
from typing import Any

from torchbucket._checks import check_instance, check_int
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.dataflux._common import gcs_config_for

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "TM_DEFAULT_CHUNK_SIZE",
    "upload_chunks_concurrently_from_bytesio",
]

TM_DEFAULT_CHUNK_SIZE = 32 * 1024 * 1024
DEFAULT_MAX_WORKERS = 8


def _uri(blob: Any) -> str:
    if isinstance(blob, str):
        return blob
    bucket = getattr(getattr(blob, "bucket", None), "name", None)
    name = getattr(blob, "name", None)
    if not isinstance(bucket, str) or not isinstance(name, str):
        raise TypeError(
            "upload_chunks_concurrently_from_bytesio: blob must be a gs:// URI or have "
            f".name and .bucket.name, got {type(blob).__name__}"
        )
    return f"gs://{bucket}/{name}"


def upload_chunks_concurrently_from_bytesio(
    bytesio: io.BytesIO,
    blob: Any,
    content_type: str | None = None,
    chunk_size: int = TM_DEFAULT_CHUNK_SIZE,
    deadline: float | None = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    *,
    checksum: str | None = "crc32c",
    timeout: Any = None,
    retry: Any = None,
) -> None:
    """Upload the whole of ``bytesio`` to ``blob`` in ``chunk_size`` parts, ``max_workers`` at once.

    Args:
        bytesio: The bytes (all of its buffer, whatever its position).
        blob: The destination (see the module).
        content_type: The object's ``Content-Type``; default
            ``application/octet-stream``.
        chunk_size: Bytes per part; at least the API's 5 MiB floor.
        deadline: Accepted, not used: the retry policy bounds every request.
        max_workers: Parts uploading at once.
        checksum: Accepted; the object's CRC32C is always checked.
        timeout: Accepted, not used.
        retry: Accepted, not used: torchbucket's retry policy applies.

    Raises:
        ConfigError: ``bytesio`` is not a ``BytesIO`` or a size is out of range.
        StorageError: The upload failed; nothing was written.
    """
    owner = "upload_chunks_concurrently_from_bytesio"
    check_instance(bytesio, io.BytesIO, owner=owner, parameter="bytesio", optional=False)
    check_int(max_workers, owner=owner, parameter="max_workers", minimum=1)
    config = CheckpointConfig(part_size=max(chunk_size, 5 << 20), parts_in_flight=max_workers)
    checkpoint = BucketCheckpoint(config=config, gcs=gcs_config_for(owner, None))
    try:
        with checkpoint.writer(_uri(blob), content_type=content_type) as writer:
            writer.write(bytesio.getbuffer())
    finally:
        checkpoint.close()
