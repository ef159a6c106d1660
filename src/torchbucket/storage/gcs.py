"""Google Cloud Storage over ``aiohttp``: ``gs://bucket/key``.

The JSON API serves listing, reads, simple and resumable uploads, compose,
delete, head and copy (rewrite); the XML API on the same host serves multipart
uploads. Credentials are Google application default credentials; with
``STORAGE_EMULATOR_HOST`` set (or an emulator endpoint given) requests go there,
anonymously.

Every request runs through :func:`torchbucket.retry.call` under the process's
adaptive limiter for the endpoint. A write is retried only where a repeat is
safe: with a generation precondition, or by the protocol (resumable chunks,
multipart parts). Where a retry of such a write meets the precondition that the
lost first attempt itself satisfied, the object is checked and accepted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import yarl

from torchbucket.config import ConcurrencyConfig, RetryConfig
from torchbucket.errors import (
    ConfigError,
    IntegrityError,
    NotFoundError,
    PreconditionFailedError,
    RetryableError,
    StorageError,
)
from torchbucket.storage import _gcs_http as _http
from torchbucket.storage import _gcs_xml as _xml
from torchbucket.storage._common import check_compose_sources, check_part_number, crc32c_b64
from torchbucket.storage._gcs_io import GCSTransport, object_info
from torchbucket.storage.base import ListPage, MultipartUpload, ObjectInfo, Part

__all__ = ["DEFAULT_ENDPOINT", "GCSConfig", "GCSStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The public GCS endpoint.
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
_CHUNK_ALIGN = 256 * 1024
_INFO_FIELDS = "name,size,generation,crc32c,storageClass"
_LIST_FIELDS = f"items({_INFO_FIELDS}),nextPageToken"


@dataclass(frozen=True, kw_only=True, slots=True)
class GCSConfig:
    """How a :class:`GCSStore` reaches GCS.

    Attributes:
        endpoint: Base URL of the service. Default ``None``: the value of
            ``$STORAGE_EMULATOR_HOST`` when set (``http://`` added when it has no
            scheme), else ``https://storage.googleapis.com``.
        project: Project to bill or attribute requests to. Default ``None``
            (the credentials' project).
        retry: Backoff, deadline and timeouts. Default ``RetryConfig()``.
        concurrency: Adaptive limit on requests in flight per process and
            endpoint; its ``maximum`` also sizes the connection pool. Default
            ``ConcurrencyConfig()``.
        anonymous: Send no credentials. Default ``None``: anonymous for an
            emulator (an endpoint from ``$STORAGE_EMULATOR_HOST``, or one whose
            host is not under ``googleapis.com``), credentialed otherwise.
        resumable_threshold: ``put`` of more bytes than this uses a resumable
            upload instead of one request. Default 8 MiB.
        chunk_size: Bytes per request of a resumable upload, a multiple of
            256 KiB. Default 16 MiB.
        connect_timeout: Seconds to open a connection. Default 10.
    """

    endpoint: str | None = None
    project: str | None = None
    retry: RetryConfig = field(default_factory=RetryConfig)
    concurrency: ConcurrencyConfig = field(default_factory=ConcurrencyConfig)
    anonymous: bool | None = None
    resumable_threshold: int = 8 << 20
    chunk_size: int = 16 << 20
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"GCSConfig.endpoint must start with http:// or https://, got {self.endpoint!r}"
            )
        if self.chunk_size <= 0 or self.chunk_size % _CHUNK_ALIGN:
            raise ConfigError(
                f"GCSConfig.chunk_size must be a positive multiple of 256 KiB, got {self.chunk_size}"
            )
        if self.resumable_threshold < 0:
            raise ConfigError(
                f"GCSConfig.resumable_threshold must be >= 0, got {self.resumable_threshold}"
            )
        if self.connect_timeout <= 0:
            raise ConfigError(f"GCSConfig.connect_timeout must be > 0, got {self.connect_timeout}")

    def resolved_endpoint(self) -> tuple[str, bool]:
        """The endpoint to use and whether it is anonymous (see the attributes)."""
        endpoint = self.endpoint
        emulator = False
        if endpoint is None:
            host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
            if host:
                endpoint = host if "://" in host else f"http://{host}"
                emulator = True
            else:
                endpoint = DEFAULT_ENDPOINT
        endpoint = endpoint.rstrip("/")
        anonymous = self.anonymous
        if anonymous is None:
            hostname = urlsplit(endpoint).hostname or ""
            anonymous = emulator or not (
                hostname == "googleapis.com" or hostname.endswith(".googleapis.com")
            )
        return endpoint, anonymous


class GCSStore(GCSTransport):
    """An :class:`~torchbucket.storage.base.ObjectStore` on one GCS bucket.

    Args:
        bucket: The bucket name.
        config: Endpoint, credentials, retries and concurrency. Default
            ``GCSConfig()``.
    """

    def __init__(self, bucket: str, *, config: GCSConfig | None = None) -> None:
        self._config = config or GCSConfig()
        endpoint, anonymous = self._config.resolved_endpoint()
        super().__init__(
            bucket,
            endpoint=endpoint,
            credentials=_http.Credentials(anonymous=anonymous),
            retry_config=self._config.retry,
            concurrency=self._config.concurrency,
            session_key=_http.SessionKey(
                limit=self._config.concurrency.maximum,
                read_timeout=self._config.retry.read_timeout,
                connect_timeout=self._config.connect_timeout,
            ),
        )
        b = quote(bucket, safe="")
        self._json_base = f"{endpoint}/storage/v1/b/{b}"
        self._object_base = f"{endpoint}/storage/v1/b/{b}/o/"
        self._upload_base = f"{endpoint}/upload/storage/v1/b/{b}/o"
        self._xml_base = f"{endpoint}/{b}"
        self._part_sizes: dict[str, dict[int, int]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (GCSStore, (self._bucket,), self._config)

    def __setstate__(self, state: GCSConfig) -> None:
        self.__init__(self._bucket, config=state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"GCSStore({self._bucket!r}, endpoint={self.endpoint!r})"

    @property
    def config(self) -> GCSConfig:
        """The store's configuration."""
        return self._config

    # ------------------------------------------------------------ URLs

    def _object_url(self, key: str, query: str = "") -> yarl.URL:
        url = self._object_base + quote(key, safe="")
        return yarl.URL(url + "?" + query if query else url, encoded=True)

    def _xml_url(self, key: str, query: str) -> yarl.URL:
        return yarl.URL(f"{self._xml_base}/{quote(key, safe='')}?{query}", encoded=True)

    # ------------------------------------------------------------ reads

    async def list_page(
        self,
        prefix: str = "",
        *,
        start_offset: str | None = None,
        end_offset: str | None = None,
        page_token: str | None = None,
        page_size: int = 1000,
    ) -> ListPage:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        query = f"maxResults={page_size}&fields={quote(_LIST_FIELDS, safe='')}"
        if prefix:
            query += "&prefix=" + quote(prefix, safe="")
        if start_offset:
            query += "&startOffset=" + quote(start_offset, safe="")
        if end_offset:
            query += "&endOffset=" + quote(end_offset, safe="")
        if page_token:
            query += "&pageToken=" + quote(page_token, safe="")
        if self._config.project:
            query += "&userProject=" + quote(self._config.project, safe="")
        url = yarl.URL(f"{self._json_base}/o?{query}", encoded=True)
        uri = self.uri(prefix)

        async def attempt() -> ListPage:
            _, _, body = await self.request("GET", url, operation="list", uri=uri, bucket_op=True)
            doc = json.loads(body)
            items = [object_info(item) for item in doc.get("items", ())]
            return ListPage(items, doc.get("nextPageToken") or None)

        return await self.call(attempt, "list", uri)

    async def head(self, key: str) -> ObjectInfo:
        url = self._object_url(key, "fields=" + quote(_INFO_FIELDS, safe=""))
        uri = self.uri(key)

        async def attempt() -> ObjectInfo:
            _, _, body = await self.request("GET", url, operation="head", uri=uri)
            return object_info(json.loads(body))

        return await self.call(attempt, "head", uri)

    async def get(
        self,
        key: str,
        *,
        start: int = 0,
        end: int | None = None,
        generation: int | None = None,
    ) -> bytes:
        if start < 0:
            raise ValueError(f"range start must be >= 0, got {start}")
        if end is not None and end < start:
            raise ValueError(f"range end {end} is before start {start}")
        if end == start:
            await self._check_exists(key, generation, "get")
            return b""
        return await self.read_object(
            self._object_url(key, self._media_query(generation)), key, start, end
        )

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        if start < 0:
            raise ValueError(f"range start must be >= 0, got {start}")
        if len(buffer) == 0:
            await self._check_exists(key, generation, "get")
            return 0
        return await self.read_object_into(
            self._object_url(key, self._media_query(generation)), key, start, buffer
        )

    async def stream(
        self, key: str, *, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        if start < 0:
            raise ValueError(f"range start must be >= 0, got {start}")
        if end is not None and end < start:
            raise ValueError(f"range end {end} is before start {start}")
        if end == start:
            await self._check_exists(key, None, "stream")
            return
        async for chunk in self.stream_object(
            lambda generation: self._object_url(key, self._media_query(generation)),
            key,
            start,
            end,
            chunk_size,
        ):
            yield chunk

    @staticmethod
    def _media_query(generation: int | None) -> str:
        return "alt=media" if generation is None else f"alt=media&generation={generation}"

    async def _check_exists(self, key: str, generation: int | None, operation: str) -> None:
        info = await self.head(key)
        if generation is not None and info.generation != generation:
            raise NotFoundError(
                f"generation {generation} is gone",
                operation=operation,
                uri=self.uri(key),
                status=404,
            )

    # ------------------------------------------------------------ writes

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_generation_match: int | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        if len(data) > self._config.resumable_threshold:
            return await self.resumable_put(
                self._upload_base,
                key,
                data,
                if_generation_match,
                content_type,
                self._config.chunk_size,
            )
        crc = crc32c_b64(data)
        meta: dict[str, Any] = {"name": key, "crc32c": crc}
        meta["contentType"] = content_type or "application/octet-stream"
        query = "uploadType=multipart&fields=" + quote(_INFO_FIELDS, safe="")
        if if_generation_match is not None:
            query += f"&ifGenerationMatch={if_generation_match}"
        url = yarl.URL(f"{self._upload_base}?{query}", encoded=True)
        boundary = "torchbucket-6c1b0e5a9f"
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
        uri = self.uri(key)

        async def attempt() -> ObjectInfo:
            _, _, resp = await self.request(
                "POST", url, operation="put", uri=uri, headers=headers, data=body
            )
            return self.check_written(object_info(json.loads(resp)), len(data), crc, "put", uri)

        if if_generation_match is None:
            return await self.call(attempt, "put", uri, idempotent=False)
        return await self.call(
            self._accept_own_write(attempt, key, size=len(data), crc32c=crc), "put", uri
        )

    async def put_stream(
        self, key: str, chunks: AsyncIterator[bytes], *, content_type: str | None = None
    ) -> ObjectInfo:
        return await self.resumable_put_stream(
            self._upload_base, key, chunks, content_type, self._config.chunk_size
        )

    def _accept_own_write(
        self,
        attempt: Callable[[], Any],
        key: str,
        *,
        size: int,
        crc32c: str | None,
    ) -> Callable[[], Any]:
        """Wrap a conditional write so that a 412 caused by its own lost attempt passes.

        When an attempt fails without a definite answer, the write may have taken
        effect; the retry then meets a precondition that no longer holds. If the
        object now holds exactly what we wrote, that was our write.
        """
        ambiguous = False

        async def wrapped() -> ObjectInfo:
            nonlocal ambiguous
            try:
                result: ObjectInfo = await attempt()
                return result
            except PreconditionFailedError:
                if ambiguous:
                    info = await self._head_or_none(key)
                    if (
                        info is not None
                        and info.size == size
                        and (crc32c is None or info.crc32c == crc32c)
                    ):
                        logger.debug("accepting %s as our own earlier write", self.uri(key))
                        return info
                raise
            except RetryableError:
                ambiguous = True
                raise

        return wrapped

    async def _head_or_none(self, key: str) -> ObjectInfo | None:
        try:
            return await self.head(key)
        except NotFoundError:
            return None

    async def compose(
        self,
        destination: str,
        sources: Sequence[ObjectInfo],
        *,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        check_compose_sources(sources)
        source_docs = []
        for source in sources:
            doc: dict[str, Any] = {"name": source.name}
            if source.generation is not None:
                doc["generation"] = source.generation
                doc["objectPreconditions"] = {"ifGenerationMatch": source.generation}
            source_docs.append(doc)
        body = json.dumps(
            {
                "sourceObjects": source_docs,
                "destination": {"contentType": "application/octet-stream"},
            }
        ).encode()
        query = "fields=" + quote(_INFO_FIELDS, safe="")
        if if_generation_match is not None:
            query += f"&ifGenerationMatch={if_generation_match}"
        url = yarl.URL(
            f"{self._object_base}{quote(destination, safe='')}/compose?{query}", encoded=True
        )
        headers = {"Content-Type": "application/json"}
        uri = self.uri(destination)

        async def attempt() -> ObjectInfo:
            _, _, resp = await self.request(
                "POST", url, operation="compose", uri=uri, headers=headers, data=body
            )
            return object_info(json.loads(resp))

        if if_generation_match is None:
            return await self.call(attempt, "compose", uri, idempotent=False)
        total = sum(s.size for s in sources)
        return await self.call(
            self._accept_own_write(attempt, destination, size=total, crc32c=None), "compose", uri
        )

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        url = self._object_url(key, "" if generation is None else f"generation={generation}")
        uri = self.uri(key)
        ambiguous = False

        async def attempt() -> None:
            nonlocal ambiguous
            try:
                await self.request("DELETE", url, operation="delete", uri=uri)
            except NotFoundError:
                if not ambiguous:
                    raise
                # A retry of a delete whose answer was lost: that one deleted it.
            except RetryableError:
                ambiguous = True
                raise

        await self.call(attempt, "delete", uri, idempotent=generation is not None)

    async def copy(self, source: str, destination: str) -> ObjectInfo:
        base = (
            f"{self._object_base}{quote(source, safe='')}/rewriteTo/b/"
            f"{quote(self._bucket, safe='')}/o/{quote(destination, safe='')}?fields="
            + quote(f"done,rewriteToken,resource({_INFO_FIELDS})", safe="")
        )
        uri = self.uri(destination)
        headers = {"Content-Type": "application/json"}
        token: str | None = None
        while True:
            url = yarl.URL(
                base + ("" if token is None else "&rewriteToken=" + quote(token, safe="")),
                encoded=True,
            )

            async def attempt(url: yarl.URL = url) -> dict[str, Any]:
                _, _, resp = await self.request(
                    "POST", url, operation="copy", uri=uri, headers=headers, data=b"{}"
                )
                doc: dict[str, Any] = json.loads(resp)
                return doc

            # A repeated rewrite leaves the destination holding the source: safe.
            doc = await self.call(attempt, "copy", uri)
            if doc.get("done"):
                return object_info(doc["resource"])
            token = doc.get("rewriteToken")
            if not token:
                raise StorageError(
                    "rewrite answered neither done nor a token", operation="copy", uri=uri
                )

    # ------------------------------------------------------------ multipart (XML API)

    async def multipart_initiate(self, key: str, *, content_type: str | None = None) -> str:
        url = self._xml_url(key, "uploads")
        uri = self.uri(key)
        headers = {"Content-Type": content_type or "application/octet-stream"}

        async def attempt() -> str:
            _, _, body = await self.request(
                "POST", url, operation="multipart initiate", uri=uri, headers=headers, data=b""
            )
            upload_id = _xml.parse_upload_id(body)
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
        url = self._xml_url(key, f"partNumber={number}&uploadId={quote(upload_id, safe='')}")
        uri = self.uri(key)
        headers = {"x-goog-hash": f"crc32c={crc32c_b64(data)}"}

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
        self._part_sizes.setdefault(upload_id, {})[number] = len(data)
        return part

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        if not parts:
            raise ValueError("multipart complete needs at least one part")
        url = self._xml_url(key, f"uploadId={quote(upload_id, safe='')}")
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
        url = self._xml_url(key, f"uploadId={quote(upload_id, safe='')}")
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
                query += "&prefix=" + quote(prefix, safe="")
            if key_marker:
                query += "&key-marker=" + quote(key_marker, safe="")
            if upload_marker:
                query += "&upload-id-marker=" + quote(upload_marker, safe="")
            url = yarl.URL(f"{self._xml_base}?{query}", encoded=True)

            async def attempt(url: yarl.URL = url) -> _xml.ListUploadsPage:
                _, _, body = await self.request(
                    "GET", url, operation="multipart list", uri=uri, bucket_op=True
                )
                return _xml.parse_list_uploads(body)

            page = await self.call(attempt, "multipart list", uri)
            uploads.extend(page.uploads)
            if page.next_key_marker is None:
                break
            key_marker, upload_marker = page.next_key_marker, page.next_upload_id_marker
        uploads.sort(key=lambda u: (u.key, u.upload_id))
        return uploads

    # ------------------------------------------------------------ misc

    async def close(self) -> None:
        await self.close_session()
