"""The XML API: path-style object GET/HEAD/PUT/DELETE and multipart uploads.

Served by the front server for both stores (fake-gcs-server has no multipart
upload API). Object calls are translated into JSON API calls on the backend;
a completed multipart upload is assembled here and written through the
backend's JSON media upload. An object or part PUT is checked against the
``x-goog-hash`` / ``Content-MD5`` sent with it, and refused on a mismatch, as
GCS does (see :mod:`._hashes`).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import quote

import google_crc32c
from aiohttp import web

from torchbucket.emulator._hashes import check_declared, declared_in_headers
from torchbucket.emulator._http import (
    ASSEMBLED_HEADER,
    ApiError,
    Call,
    error_response,
    json_call,
    rfc3339,
    xml_escape,
)
from torchbucket.emulator._pieces import Pieces
from torchbucket.emulator._xml_wire import NS, as_xml_error, copy_generation, parse_complete, xml

__all__ = ["XmlApi"]

MAX_PARTS = 10_000


class JsonBackend(Protocol):
    """What the XML API needs from a store: JSON API calls."""

    async def handle(self, call: Call) -> web.Response:
        """Answer one JSON API call."""
        ...


class _Upload:
    __slots__ = ("bucket", "content_type", "initiated", "key", "parts", "upload_id")

    def __init__(self, bucket: str, key: str, upload_id: str, content_type: str | None) -> None:
        self.bucket = bucket
        self.key = key
        self.upload_id = upload_id
        self.content_type = content_type
        self.initiated = time.time()
        # part number -> (etag without quotes, data, time)
        self.parts: dict[int, tuple[str, bytes, float]] = {}


class XmlApi:
    """XML API handlers over a JSON backend, with multipart upload state."""

    def __init__(self, backend: JsonBackend, *, min_part_size: int = 0) -> None:
        self.backend = backend
        self.min_part_size = min_part_size
        self.uploads: dict[str, _Upload] = {}
        self._handlers: dict[str, Callable[[Call], Awaitable[web.Response]]] = {
            "xml_get": self._get,
            "xml_head": self._get,
            "xml_put": self._put,
            "xml_delete": self._delete,
            "mpu_initiate": self._initiate,
            "mpu_part": self._part,
            "mpu_complete": self._complete,
            "mpu_abort": self._abort,
            "mpu_list": self._list_uploads,
            "mpu_parts": self._list_parts,
        }

    async def handle(self, call: Call) -> web.Response:
        """Answer one XML API call."""
        handler = self._handlers.get(call.route.kind)
        if handler is None:
            return error_response(
                400,
                f"The XML API call {call.method} {call.path_qs} is not emulated.",
                xml=True,
                xml_code="NotImplemented",
            )
        try:
            return await handler(call)
        except ApiError as exc:
            return error_response(exc.status, exc.message, xml=True, xml_code=exc.xml_code)

    async def _bucket_exists(self, call: Call) -> None:
        resp = await self.backend.handle(
            json_call("GET", "bucket_get", call.route.bucket, host=call.host)
        )
        if resp.status == 404:
            raise ApiError(
                404,
                f"The specified bucket {call.route.bucket} does not exist.",
                xml_code="NoSuchBucket",
            )
        if resp.status >= 400:
            raise ApiError(resp.status, f"bucket check failed with {resp.status}")

    def _preconditions(self, call: Call) -> dict[str, str]:
        query = {}
        match = call.headers.get("x-goog-if-generation-match")
        if match is not None:
            query["ifGenerationMatch"] = match
        return query

    # -- objects -------------------------------------------------------------

    async def _get(self, call: Call) -> web.Response:
        headers = {}
        rng = call.headers.get("Range")
        if rng:
            headers["Range"] = rng
        query = {}
        if "generation" in call.query:
            query["generation"] = call.query["generation"]
        resp = await self.backend.handle(
            json_call(
                "GET",
                "media",
                call.route.bucket,
                call.route.name,
                query=query,
                headers=headers,
                host=call.host,
            )
        )
        return as_xml_error(resp)

    async def _put(self, call: Call) -> web.Response:
        check_declared(declared_in_headers(call.headers, xml=True), call.body, xml=True)
        headers = {}
        ctype = call.headers.get("Content-Type")
        if ctype:
            headers["Content-Type"] = ctype
        resp = await self.backend.handle(
            json_call(
                "POST",
                "upload_media",
                call.route.bucket,
                call.route.name,
                query=self._preconditions(call),
                headers=headers,
                body=call.body,
                host=call.host,
            )
        )
        if resp.status >= 400:
            return as_xml_error(resp, "NoSuchBucket")
        md5 = hashlib.md5(call.body).hexdigest()
        out = web.Response(status=200, headers={"ETag": f'"{md5}"'})
        copy_generation(resp, out)
        return out

    async def _delete(self, call: Call) -> web.Response:
        resp = await self.backend.handle(
            json_call("DELETE", "delete", call.route.bucket, call.route.name, host=call.host)
        )
        if resp.status >= 400:
            return as_xml_error(resp)
        return web.Response(status=204)

    # -- multipart uploads ---------------------------------------------------

    def _upload(self, call: Call) -> _Upload:
        upload_id = call.query.get("uploadId", "")
        upload = self.uploads.get(upload_id)
        if upload is None or upload.bucket != call.route.bucket or upload.key != call.route.name:
            raise ApiError(
                404,
                "The requested upload was not found (it may have been completed or aborted).",
                xml_code="NoSuchUpload",
            )
        return upload

    async def _initiate(self, call: Call) -> web.Response:
        await self._bucket_exists(call)
        upload_id = secrets.token_urlsafe(32)
        self.uploads[upload_id] = _Upload(
            call.route.bucket, call.route.name, upload_id, call.headers.get("Content-Type")
        )
        return xml(
            f"<InitiateMultipartUploadResult {NS}><Bucket>{xml_escape(call.route.bucket)}"
            f"</Bucket><Key>{xml_escape(call.route.name)}</Key><UploadId>{upload_id}</UploadId>"
            "</InitiateMultipartUploadResult>"
        )

    async def _part(self, call: Call) -> web.Response:
        upload = self._upload(call)
        try:
            number = int(call.query.get("partNumber", ""))
        except ValueError:
            raise ApiError(
                400, "partNumber must be an integer", xml_code="InvalidArgument"
            ) from None
        if not 1 <= number <= MAX_PARTS:
            raise ApiError(
                400,
                f"partNumber must be in [1, {MAX_PARTS}], got {number}",
                xml_code="InvalidArgument",
            )
        # GCS checks a part against the x-goog-hash / Content-MD5 sent with it
        # and refuses a mismatch: the part is not stored (see _hashes).
        declared = declared_in_headers(call.headers, xml=True)
        check_declared(declared, call.body, xml=True)
        # GCS's part ETag is the part's MD5 and clients treat it as opaque. MD5
        # costs ~1.8 ms of server CPU per MiB (CRC32C ~0.1), the largest share of
        # the emulator's cost per uploaded byte, so the model tags a part with
        # its CRC32C and length instead and reports only the CRC32C hash, which
        # is the one google-resumable-media's XMLMPUPart checks.
        crc = (  # a declared CRC32C was just checked against the body: it is the body's
            int.from_bytes(base64.b64decode(declared.crc32c), "big")
            if declared.crc32c is not None
            else google_crc32c.value(call.body)
        )
        etag = f"{crc:08x}{len(call.body):016x}"
        upload.parts[number] = (etag, call.body, time.time())
        hashes = "crc32c=" + base64.b64encode(crc.to_bytes(4, "big")).decode()
        return web.Response(status=200, headers={"ETag": f'"{etag}"', "x-goog-hash": hashes})

    async def _complete(self, call: Call) -> web.Response:
        upload = self._upload(call)
        wanted = parse_complete(call.body)
        chunks: list[bytes] = []
        previous = 0
        for i, (number, etag) in enumerate(wanted):
            if number <= previous:
                raise ApiError(
                    400,
                    "The list of parts was not in ascending order.",
                    xml_code="InvalidPartOrder",
                )
            previous = number
            stored = upload.parts.get(number)
            if stored is None or stored[0] != etag:
                raise ApiError(
                    400,
                    f"Part {number} was not uploaded, or its ETag does not match.",
                    xml_code="InvalidPart",
                )
            if i < len(wanted) - 1 and len(stored[1]) < self.min_part_size:
                raise ApiError(
                    400,
                    f"Part {number} is {len(stored[1])} bytes; every part but the last must be "
                    f"at least {self.min_part_size} bytes.",
                    xml_code="EntityTooSmall",
                )
            chunks.append(stored[1])
        headers = {"Content-Type": upload.content_type} if upload.content_type else {}
        headers[ASSEMBLED_HEADER] = "1"
        resp = await self.backend.handle(
            json_call(
                "POST",
                "upload_media",
                upload.bucket,
                upload.key,
                query=self._preconditions(call),
                headers=headers,
                host=call.host,
                assembled=Pieces.of(chunks),  # not joined: see _pieces
            )
        )
        if resp.status >= 400:
            return as_xml_error(resp, "NoSuchBucket")
        self.uploads.pop(upload.upload_id, None)
        digest = hashlib.md5(b"".join(bytes.fromhex(e) for _, e in wanted)).hexdigest()
        etag = f'"{digest}-{len(wanted)}"'
        out = xml(
            f"<CompleteMultipartUploadResult {NS}><Location>http://{xml_escape(call.host)}/"
            f"{xml_escape(upload.bucket)}/{xml_escape(quote(upload.key))}</Location>"
            f"<Bucket>{xml_escape(upload.bucket)}</Bucket><Key>{xml_escape(upload.key)}</Key>"
            f"<ETag>{xml_escape(etag)}</ETag></CompleteMultipartUploadResult>"
        )
        copy_generation(resp, out)
        return out

    async def _abort(self, call: Call) -> web.Response:
        upload = self._upload(call)
        del self.uploads[upload.upload_id]
        return web.Response(status=204)

    async def _list_uploads(self, call: Call) -> web.Response:
        await self._bucket_exists(call)
        q = call.query
        prefix = q.get("prefix", "")
        key_marker = q.get("key-marker", "")
        id_marker = q.get("upload-id-marker", "")
        try:
            max_uploads = max(1, min(int(q.get("max-uploads", "1000")), 1000))
        except ValueError:
            raise ApiError(
                400, "max-uploads must be an integer", xml_code="InvalidArgument"
            ) from None
        found = sorted(
            (u.key, u.initiated, u.upload_id, u)
            for u in self.uploads.values()
            if u.bucket == call.route.bucket and u.key.startswith(prefix)
        )
        keys = [(k, uid) for k, _, uid, _ in found]
        start = 0
        if key_marker:
            start = bisect.bisect_right(keys, (key_marker, id_marker or "\U0010ffff"))
        page = found[start : start + max_uploads]
        truncated = start + max_uploads < len(found)
        rows = "".join(
            f"<Upload><Key>{xml_escape(k)}</Key><UploadId>{uid}</UploadId>"
            f"<StorageClass>STANDARD</StorageClass><Initiated>{rfc3339(t)}</Initiated></Upload>"
            for k, t, uid, _ in page
        )
        nxt = ""
        if truncated and page:
            nxt = (
                f"<NextKeyMarker>{xml_escape(page[-1][0])}</NextKeyMarker>"
                f"<NextUploadIdMarker>{page[-1][2]}</NextUploadIdMarker>"
            )
        return xml(
            f"<ListMultipartUploadsResult {NS}><Bucket>{xml_escape(call.route.bucket)}</Bucket>"
            f"<KeyMarker>{xml_escape(key_marker)}</KeyMarker>"
            f"<UploadIdMarker>{xml_escape(id_marker)}</UploadIdMarker>{nxt}"
            f"<Prefix>{xml_escape(prefix)}</Prefix><MaxUploads>{max_uploads}</MaxUploads>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{rows}"
            "</ListMultipartUploadsResult>"
        )

    async def _list_parts(self, call: Call) -> web.Response:
        upload = self._upload(call)
        rows = "".join(
            f"<Part><PartNumber>{n}</PartNumber><LastModified>{rfc3339(t)}</LastModified>"
            f'<ETag>"{etag}"</ETag><Size>{len(data)}</Size></Part>'
            for n, (etag, data, t) in sorted(upload.parts.items())
        )
        return xml(
            f"<ListPartsResult {NS}><Bucket>{xml_escape(upload.bucket)}</Bucket>"
            f"<Key>{xml_escape(upload.key)}</Key><UploadId>{upload.upload_id}</UploadId>"
            f"<IsTruncated>false</IsTruncated>{rows}</ListPartsResult>"
        )
