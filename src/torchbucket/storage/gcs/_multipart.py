"""The XML multipart upload protocol of the GCS store, on the JSON API's host.

Path-style requests: ``POST /{bucket}/{key}?uploads`` starts an upload,
``PUT ?partNumber=N&uploadId=X`` sends a part, ``POST ?uploadId=X`` assembles
the parts, ``DELETE ?uploadId=X`` abandons them and ``GET /{bucket}?uploads``
lists what is incomplete. Parts and aborts are idempotent; a completion whose
answer was lost is recognised on retry by the object it created. An initiate
whose answer was lost may have created an upload nobody knows the id of: once
the initiate is over (succeeded or failed), the uploads to exactly that key that
began since it started, other than the one returned, are aborted.

A part's bytes go out a slice at a time (:class:`_PartBody`), not in one write:
on Python before 3.12.9 aiohttp joins the request's headers to a bytes-like
body (a copy of the whole part), and asyncio copies what the socket does not
take at once (most of an 8 MiB part) into the transport's buffer, where it stays
until sent. Written in slices, waiting for the transport to drain between them,
a part is sent from the caller's buffer with at most a slice copied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

import aiohttp
import yarl
from aiohttp.abc import AbstractStreamWriter

from torchbucket.errors import IntegrityError, NotFoundError, RetryableError, StorageError
from torchbucket.storage._common import check_part_number
from torchbucket.storage.base import MultipartUpload, ObjectInfo, Part, PartData, part_pieces
from torchbucket.storage.crc32c import combine
from torchbucket.storage.gcs import _errors, _head, _objects, _xml
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import crc_b64, extend_crc, hash_header_crc32c, quote_name

__all__ = ["XMLMultipart"]

logger = logging.getLogger(__name__)

#: Seconds by which the server's clock may trail ours when telling the uploads an
#: initiate started from older ones (the window only opens after a lost answer).
_CLOCK_SLACK = 2.0

#: Bytes of a part handed to the connection at once.
_SLICE = 256 * 1024


class _PartBody(aiohttp.Payload):
    """A part's bytes, written to the connection :data:`_SLICE` bytes at a time.

    The part may be several buffers (a checkpoint's part gathered from its
    tensors' own memory), sent one after another. Reusable: each attempt of a
    retried part writes it from the start.
    """

    _autoclose = True

    def __init__(self, data: PartData) -> None:
        pieces = part_pieces(data)
        super().__init__(pieces, content_type="application/octet-stream")
        self._pieces = pieces
        self._length = sum(len(piece) for piece in pieces)
        self._size = self._length

    def __len__(self) -> int:
        return self._length

    @property
    def pieces(self) -> list[memoryview]:
        """The part's bytes, in order."""
        return self._pieces

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._pieces).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        left = self._length if content_length is None else content_length
        for piece in self._pieces:
            view = piece[:left]
            for start in range(0, len(view), _SLICE):
                # Drains (waits until the transport has sent what it holds) as needed.
                await writer.write(view[start : start + _SLICE])
            left -= len(view)
            if not left:
                return


def _answered_info(
    key: str, headers: Mapping[str, str] | None, expected: tuple[int, int] | None
) -> ObjectInfo | None:
    """The completed object from the completion's answer, where it vouches for it.

    GCS answers a completion with the object's generation and CRC32C (not its
    size or storage class). When that CRC32C is the one of the parts sent, in
    order, the object holds them (and so their size): it is known without
    another request (a metadata read, 20 ms on the same-region emulator, at the
    end of every save). ``None`` otherwise: the caller reads the metadata.
    """
    if headers is None or expected is None:
        return None
    generation = headers.get("x-goog-generation")
    crc32c = hash_header_crc32c(headers)
    if not generation or not generation.isdigit() or crc32c != crc_b64(expected[1]):
        return None
    return ObjectInfo(key, expected[0], int(generation), crc32c)


class XMLMultipart:
    """Multipart uploads of one store, sent through its transport.

    It remembers the size and CRC32C of each part it sent, so that a
    completion's answer can vouch for the object it assembled.

    Args:
        transport: The store's transport.
    """

    def __init__(self, transport: GCSTransport) -> None:
        self._transport = transport
        # Size and CRC32C of the parts sent from this process, by upload id and
        # part number, to check what complete built.
        self._sent: dict[str, dict[int, tuple[int, int]]] = {}

    def _xml_url(self, key: str, query: str) -> yarl.URL:
        return yarl.URL(f"{self._transport.urls.xml_base}/{quote_name(key)}?{query}", encoded=True)

    async def initiate(self, key: str, *, content_type: str | None = None) -> str:
        url = self._xml_url(key, "uploads")
        uri = self._transport.urls.uri(key)
        headers = {"Content-Type": content_type or "application/octet-stream"}

        started = time.time()
        unsure = False

        async def attempt() -> str:
            nonlocal unsure
            try:
                _, _, body = await self._transport.request(
                    "POST", url, operation="multipart initiate", uri=uri, headers=headers, data=b""
                )
                upload_id = _errors.parse_body(
                    _xml.parse_upload_id, body, operation="multipart initiate", uri=uri
                )
            except (RetryableError, asyncio.CancelledError):
                unsure = True  # the upload may exist; its id was lost
                raise
            if not upload_id:
                raise StorageError(
                    "initiate answered no UploadId", operation="multipart initiate", uri=uri
                )
            return upload_id

        try:
            upload_id = await self._transport.call(attempt, "multipart initiate", uri)
        except StorageError:
            if unsure:
                await self._abort_strays(key, started, keep=None)
            raise
        if unsure:
            await self._abort_strays(key, started, keep=upload_id)
        return upload_id

    async def _abort_strays(self, key: str, since: float, *, keep: str | None) -> None:
        """Abort the uploads to exactly ``key`` begun since ``since``, but ``keep``.

        They are what initiates whose answers were lost created. An upload that
        another writer began to the same key in that window is aborted too (two
        saves to one object at once race whatever happens; the store cannot
        tell whose an upload is). A failure here does not fail the initiate: a
        stray upload costs storage only, until ``torchbucket cleanup`` removes
        it. An initiate that reaches the server only after this listing (held
        in a network queue) still leaves its upload behind.
        """
        try:
            uploads = await self.list_uploads(key)
            strays = [
                u
                for u in uploads
                if u.key == key
                and u.upload_id != keep
                and u.initiated is not None
                and u.initiated >= since - _CLOCK_SLACK
            ]
            for upload in strays:
                try:
                    await self.abort(key, upload.upload_id)
                except NotFoundError:
                    pass  # completed or aborted meanwhile
        except StorageError:
            logger.warning(
                "could not abort the uploads that lost initiate answers left at %s; "
                "`torchbucket cleanup` removes them",
                self._transport.urls.uri(key),
                exc_info=True,
            )
            return
        if strays:
            logger.info("aborted %d upload(s) whose initiate answer was lost", len(strays))

    async def upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: PartData,
        *,
        crc32c: int | None = None,
    ) -> Part:
        """Send part ``number``, declaring its CRC32C (``crc32c``, or computed here).

        A caller that checksummed the part already (the checkpoint writer, for
        the whole object's CRC32C) passes it, so that the bytes are read once.
        GCS refuses the part if it does not match what arrives.
        """
        check_part_number(number)
        url = self._xml_url(key, f"partNumber={number}&uploadId={quote_name(upload_id)}")
        uri = self._transport.urls.uri(key)
        body = _PartBody(data)
        crc = crc32c
        if crc is None:
            crc = 0
            for piece in body.pieces:
                crc = extend_crc(crc, piece)
        sent_crc = crc_b64(crc)
        headers = {"x-goog-hash": f"crc32c={sent_crc}"}

        async def attempt() -> Part:
            # GCS checks the part against its x-goog-hash and refuses damaged
            # bytes (https://cloud.google.com/storage/docs/xml-api/put-object-multipart).
            _, resp_headers, _ = await self._transport.upload_request(
                "PUT", url, operation="multipart upload part", uri=uri, headers=headers, data=body
            )
            etag = resp_headers.get("ETag")
            if not etag:
                raise StorageError(
                    f"part {number} answered no ETag", operation="multipart upload part", uri=uri
                )
            answered = hash_header_crc32c(resp_headers)
            if answered is not None and answered != sent_crc:
                # The store holds other bytes than were sent: sent again, the
                # part replaces them.
                raise IntegrityError(
                    f"part {number} was stored with CRC32C {answered}, sent with {sent_crc}",
                    operation="multipart upload part",
                    uri=uri,
                )
            return Part(number, etag)

        part = await self._transport.call(attempt, "multipart upload part", uri)
        self._sent.setdefault(upload_id, {})[number] = (len(body), crc)
        return part

    async def complete(self, key: str, upload_id: str, parts: Sequence[Part]) -> ObjectInfo:
        if not parts:
            raise ValueError("multipart complete needs at least one part")
        url = self._xml_url(key, f"uploadId={quote_name(upload_id)}")
        uri = self._transport.urls.uri(key)
        body = _xml.complete_body(parts)
        headers = {"Content-Type": "application/xml"}
        sent = self._sent.get(upload_id, {})
        expected: tuple[int, int] | None = None  # size and CRC32C of the parts, in order
        if all(p.number in sent for p in parts):
            size = crc = 0
            for p in parts:
                part_size, part_crc = sent[p.number]
                size, crc = size + part_size, combine(crc, part_crc, part_size)
            expected = (size, crc)
        ambiguous = False

        async def attempt() -> Mapping[str, str] | None:
            nonlocal ambiguous
            try:
                _, resp_headers, resp = await self._transport.request(
                    "POST", url, operation="multipart complete", uri=uri, headers=headers, data=body
                )
            except NotFoundError:
                # NoSuchUpload on a retry: the lost first attempt completed it.
                if ambiguous and await _head.head_or_none(self._transport, key) is not None:
                    return None
                raise
            except RetryableError:
                ambiguous = True
                raise
            code, _ = _errors.error_code(resp)
            if code:  # an error document inside a 200
                raise _errors.error_for_response(
                    500, {}, resp, operation="multipart complete", uri=uri
                )
            return resp_headers

        answer = await self._transport.call(attempt, "multipart complete", uri)
        self._sent.pop(upload_id, None)
        info = _answered_info(key, answer, expected)
        if info is None:
            info = await _head.head(self._transport, key)
        if expected is not None and info.size != expected[0]:
            raise IntegrityError(
                f"completed object has {info.size} bytes, the parts held {expected[0]}",
                operation="multipart complete",
                uri=uri,
            )
        return info

    async def abort(self, key: str, upload_id: str) -> None:
        url = self._xml_url(key, f"uploadId={quote_name(upload_id)}")
        await _objects.delete_url(
            self._transport, url, "multipart abort", self._transport.urls.uri(key)
        )
        self._sent.pop(upload_id, None)

    async def list_uploads(self, prefix: str = "") -> list[MultipartUpload]:
        uri = self._transport.urls.uri(prefix)
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
            url = yarl.URL(f"{self._transport.urls.xml_base}?{query}", encoded=True)

            async def attempt(url: yarl.URL = url) -> _xml.ListUploadsPage:
                # Not a bucket_op: a 404 here is a missing bucket only when its
                # code says NoSuchBucket; a bare 404 is an endpoint without the
                # XML multipart API (torchbucket cleanup then skips uploads).
                _, _, body = await self._transport.request(
                    "GET", url, operation="multipart list", uri=uri
                )
                return _errors.parse_body(
                    _xml.parse_list_uploads, body, operation="multipart list", uri=uri
                )

            page = await self._transport.call(attempt, "multipart list", uri)
            uploads.extend(page.uploads)
            if page.next_key_marker is None:
                break
            key_marker, upload_marker = page.next_key_marker, page.next_upload_id_marker
        uploads.sort(key=lambda u: (u.key, u.upload_id))
        return uploads
