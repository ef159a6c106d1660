"""The simple upload of the GCS store: one request with the object's metadata and bytes.

A JSON API ``uploadType=multipart`` request (``multipart/related``: the metadata,
then the bytes). The metadata declares the bytes' CRC32C, so GCS refuses
damaged bytes (https://cloud.google.com/storage/docs/data-validation). It is
retried even without a precondition (:func:`._uncertain.write`).
"""

from __future__ import annotations

import json
from typing import Any

import yarl

from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import _errors, _uncertain
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, crc32c_of, quote_name

__all__ = ["put"]

_BOUNDARY = "torchbucket-6c1b0e5a9f"


async def put(
    transport: GCSTransport,
    key: str,
    data: bytes | bytearray | memoryview,
    size: int,
    if_generation_match: int | None,
    content_type: str | None,
) -> ObjectInfo:
    """Upload ``data`` (``size`` bytes) in one request."""
    crc = crc32c_of(data)
    meta: dict[str, Any] = {"name": key, "crc32c": crc}
    meta["contentType"] = content_type or "application/octet-stream"
    query = "uploadType=multipart&fields=" + quote_name(INFO_FIELDS)
    boundary = _BOUNDARY
    body = b"".join(
        (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            json.dumps(meta).encode(),
            f"\r\n--{boundary}\r\nContent-Type: {meta['contentType']}\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        )
    )
    headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
    uri = transport.urls.uri(key)

    async def send(precondition: int | None) -> ObjectInfo:
        q = query if precondition is None else f"{query}&ifGenerationMatch={precondition}"
        url = yarl.URL(f"{transport.urls.upload_base}?{q}", encoded=True)
        # The crc32c in the metadata makes GCS refuse damaged bytes.
        # bucket_op: creating an object needs nothing but its bucket, so a 404 says that is missing.
        _, _, resp = await transport.upload_request(
            "POST", url, operation="put", uri=uri, headers=headers, data=body, bucket_op=True
        )
        info = _errors.parse_info(resp, operation="put", uri=uri)
        return _uncertain.check_written(info, size, crc, "put", uri)

    # Retried even without a precondition: an attempt whose outcome is
    # uncertain is checked against the object, and the repeat is pinned.
    return await _uncertain.write(
        transport,
        send,
        key,
        size=size,
        crc32c=crc,
        if_generation_match=if_generation_match,
        operation="put",
    )
