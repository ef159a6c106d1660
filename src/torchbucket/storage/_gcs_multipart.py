"""Multipart uploads through GCS's XML API, on the JSON API's host.

Path-style requests: ``POST /{bucket}/{key}?uploads`` starts an upload,
``PUT ?partNumber=N&uploadId=X`` sends a part, ``POST ?uploadId=X`` assembles
the parts, ``DELETE ?uploadId=X`` abandons them and ``GET /{bucket}?uploads``
lists what is incomplete. Parts and aborts are idempotent; a completion whose
answer was lost is recognised on retry by the object it created.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import yarl

from torchbucket.errors import IntegrityError, NotFoundError, RetryableError, StorageError
from torchbucket.storage import _gcs_http as _http
from torchbucket.storage import _gcs_xml as _xml
from torchbucket.storage._common import check_part_number
from torchbucket.storage._gcs_resumable import GCSUploads
from torchbucket.storage._gcs_wire import crc32c_of, quote_name
from torchbucket.storage.base import MultipartUpload, ObjectInfo, Part

__all__ = ["GCSMultipart"]

logger = logging.getLogger(__name__)


class GCSMultipart(GCSUploads):
    """The XML multipart upload API on top of :class:`GCSUploads`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Sizes of the parts sent from this process, to check what complete built.
        self._part_sizes: dict[str, dict[int, int]] = {}

    def _xml_url(self, key: str, query: str) -> yarl.URL:
        return yarl.URL(f"{self._xml_base}/{quote_name(key)}?{query}", encoded=True)

    async def multipart_initiate(self, key: str, *, content_type: str | None = None) -> str:
        url = self._xml_url(key, "uploads")
        uri = self.uri(key)
        headers = {"Content-Type": content_type or "application/octet-stream"}

        async def attempt() -> str:
            _, _, body = await self.request(
                "POST", url, operation="multipart initiate", uri=uri, headers=headers, data=b""
            )
            upload_id = _http.parse_body(
                _xml.parse_upload_id, body, operation="multipart initiate", uri=uri
            )
            if not upload_id:
                raise StorageError(
                    "initiate answered no UploadId", operation="multipart initiate", uri=uri
                )
            return upload_id

        # A repeat only leaves an empty upload behind, which abort_incomplete_uploads clears.
        return await self.call(attempt, "multipart initiate", uri)

    async def multipart_upload_part(
        self, key: str, upload_id: str, number: int, data: bytes | bytearray | memoryview
    ) -> Part:
        check_part_number(number)
        url = self._xml_url(key, f"partNumber={number}&uploadId={quote_name(upload_id)}")
        uri = self.uri(key)
        headers = {"x-goog-hash": f"crc32c={crc32c_of(data)}"}

        async def attempt() -> Part:
            _, resp_headers, _ = await self.request(
                "PUT", url, operation="multipart upload part", uri=uri, headers=headers, data=data
            )
            etag = resp_headers.get("ETag")
            if not etag:
                raise StorageError(
                    f"part {number} answered no ETag", operation="multipart upload part", uri=uri
                )
            return Part(number, etag)

        part = await self.call(attempt, "multipart upload part", uri)
        self._part_sizes.setdefault(upload_id, {})[number] = (
            data.nbytes if isinstance(data, memoryview) else len(data)
        )
        return part

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        if not parts:
            raise ValueError("multipart complete needs at least one part")
        url = self._xml_url(key, f"uploadId={quote_name(upload_id)}")
        uri = self.uri(key)
        body = _xml.complete_body(parts)
        headers = {"Content-Type": "application/xml"}
        sizes = self._part_sizes.get(upload_id, {})
        expected = (
            sum(sizes[p.number] for p in parts) if all(p.number in sizes for p in parts) else None
        )
        ambiguous = False

        async def attempt() -> None:
            nonlocal ambiguous
            try:
                _, _, resp = await self.request(
                    "POST", url, operation="multipart complete", uri=uri, headers=headers, data=body
                )
            except NotFoundError:
                # NoSuchUpload on a retry: the lost first attempt completed it.
                if ambiguous and await self._head_or_none(key) is not None:
                    return
                raise
            except RetryableError:
                ambiguous = True
                raise
            code, _ = _http.error_code(resp)
            if code:  # an error document inside a 200
                raise _http.error_for_response(
                    500, {}, resp, operation="multipart complete", uri=uri
                )

        await self.call(attempt, "multipart complete", uri)
        self._part_sizes.pop(upload_id, None)
        info = await self.head(key)
        if expected is not None and info.size != expected:
            raise IntegrityError(
                f"completed object has {info.size} bytes, the parts held {expected}",
                operation="multipart complete",
                uri=uri,
            )
        return info

    async def multipart_abort(self, key: str, upload_id: str) -> None:
        url = self._xml_url(key, f"uploadId={quote_name(upload_id)}")
        uri = self.uri(key)
        ambiguous = False

        async def attempt() -> None:
            nonlocal ambiguous
            try:
                await self.request("DELETE", url, operation="multipart abort", uri=uri)
            except NotFoundError:
                if not ambiguous:
                    raise
            except RetryableError:
                ambiguous = True
                raise

        await self.call(attempt, "multipart abort", uri)
        self._part_sizes.pop(upload_id, None)

    async def multipart_list(self, prefix: str = "") -> list[MultipartUpload]:
        uri = self.uri(prefix)
        uploads: list[MultipartUpload] = []
        key_marker: str | None = None
        upload_marker: str | None = None
        while True:
            query = "uploads"
            if prefix:
                query += "&prefix=" + quote_name(prefix)
            if key_marker:
                query += "&key-marker=" + quote_name(key_marker)
            if upload_marker:
                query += "&upload-id-marker=" + quote_name(upload_marker)
            url = yarl.URL(f"{self._xml_base}?{query}", encoded=True)

            async def attempt(url: yarl.URL = url) -> _xml.ListUploadsPage:
                _, _, body = await self.request(
                    "GET", url, operation="multipart list", uri=uri, bucket_op=True
                )
                return _http.parse_body(
                    _xml.parse_list_uploads, body, operation="multipart list", uri=uri
                )

            page = await self.call(attempt, "multipart list", uri)
            uploads.extend(page.uploads)
            if page.next_key_marker is None:
                break
            key_marker, upload_marker = page.next_key_marker, page.next_upload_id_marker
        uploads.sort(key=lambda u: (u.key, u.upload_id))
        return uploads
