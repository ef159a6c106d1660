"""Google Cloud Storage over ``aiohttp``: ``gs://bucket/key``.

The JSON API serves listing, reads, simple and resumable uploads, compose,
delete, head and copy (rewrite); the XML API on the same host serves multipart
uploads. Credentials are Google application default credentials; with
``STORAGE_EMULATOR_HOST`` set (or an emulator endpoint given) requests go there,
anonymously.

Every request runs through :func:`torchbucket.retry.call` under the process's
adaptive limiter for the endpoint. A write is retried only where a repeat is
safe: by the protocol (resumable chunks, multipart parts), or with a generation
precondition. A write whose outcome is uncertain (no definite answer: a server
error, a reset, a timeout, a garbled answer) may have taken effect, so it is
resolved by the object itself: if the object holds exactly what was sent (size
and CRC32C), the write is accepted; otherwise a simple upload is repeated pinned
to the generation just seen (see ``GCSTransport.write``). A multipart initiate
whose answer was lost aborts the empty uploads it may have left.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import yarl

from torchbucket.errors import (
    IntegrityError,
    NotFoundError,
    StorageError,
)
from torchbucket.storage import _gcs_http as _http
from torchbucket.storage._common import check_compose_sources
from torchbucket.storage._crc32c import combine
from torchbucket.storage._gcs_config import DEFAULT_ENDPOINT, GCSConfig
from torchbucket.storage._gcs_multipart import GCSMultipart
from torchbucket.storage._gcs_wire import (
    INFO_FIELDS,
    crc32c_of,
    crc_b64,
    object_info,
    object_infos,
    quote_name,
)
from torchbucket.storage.base import ListPage, ObjectInfo

__all__ = ["DEFAULT_ENDPOINT", "GCSConfig", "GCSStore"]

logger = logging.getLogger(__name__)

_LIST_FIELDS = f"items({INFO_FIELDS}),nextPageToken"
_FOLDER_FIELDS = f"items({INFO_FIELDS}),prefixes,nextPageToken"


def combined_crc32c(sources: Sequence[ObjectInfo]) -> str | None:
    """The CRC32C of the sources' bytes in order, or ``None`` if one lacks its own."""
    crc = 0
    for source in sources:
        if source.crc32c is None:
            return None
        try:
            value = int.from_bytes(base64.b64decode(source.crc32c, validate=True), "big")
        except (binascii.Error, ValueError):
            return None
        crc = combine(crc, value, source.size)
    return crc_b64(crc)


def _list_page(body: bytes) -> ListPage:
    doc = json.loads(body)
    return ListPage(
        object_infos(doc.get("items", ())),
        doc.get("nextPageToken") or None,
        sorted(doc.get("prefixes", ())),
    )


# (endpoint, bucket) -> soft-delete retention (see GCSStore.soft_delete_retention).
_soft_delete_cache: dict[tuple[str, str], int | None] = {}


class GCSStore(GCSMultipart):
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
            credentials=_http.shared_credentials(
                anonymous=anonymous, user_project=self._config.project
            ),
            retry_config=self._config.retry,
            concurrency=self._config.concurrency,
            session_key=_http.SessionKey(
                limit=self._config.concurrency.maximum,
                read_timeout=self._config.retry.read_timeout,
                connect_timeout=self._config.connect_timeout,
            ),
        )

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
        return await self._list(
            prefix,
            _LIST_FIELDS,
            page_token,
            page_size,
            startOffset=start_offset,
            endOffset=end_offset,
        )

    async def list_folder(
        self, prefix: str, *, page_token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        return await self._list(prefix, _FOLDER_FIELDS, page_token, page_size, delimiter="/")

    async def _list(
        self,
        prefix: str,
        fields: str,
        page_token: str | None,
        page_size: int,
        **params: str | None,
    ) -> ListPage:
        """One page of ``objects.list``, with ``params`` added where set."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        query = f"maxResults={page_size}&fields={quote_name(fields)}"
        for name, value in {"prefix": prefix, **params, "pageToken": page_token}.items():
            if value:
                query += f"&{name}=" + quote_name(value)
        url = yarl.URL(f"{self._json_base}/o?{query}", encoded=True)
        uri = self.uri(prefix)

        async def attempt() -> ListPage:
            _, _, body = await self.request("GET", url, operation="list", uri=uri, bucket_op=True)
            return _http.parse_body(_list_page, body, operation="list", uri=uri)

        return await self.call(attempt, "list", uri)

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
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self._config.resumable_threshold:
            return await self.resumable_put(
                self._upload_base,
                key,
                data,
                if_generation_match,
                content_type,
                self._config.chunk_size,
            )
        crc = crc32c_of(data)
        meta: dict[str, Any] = {"name": key, "crc32c": crc}
        meta["contentType"] = content_type or "application/octet-stream"
        query = "uploadType=multipart&fields=" + quote_name(INFO_FIELDS)
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

        async def send(precondition: int | None) -> ObjectInfo:
            q = query if precondition is None else f"{query}&ifGenerationMatch={precondition}"
            url = yarl.URL(f"{self._upload_base}?{q}", encoded=True)
            # The crc32c in the metadata makes GCS refuse damaged bytes.
            _, _, resp = await self.upload_request(
                "POST", url, operation="put", uri=uri, headers=headers, data=body
            )
            info = _http.parse_info(resp, operation="put", uri=uri)
            return self.check_written(info, size, crc, "put", uri)

        # Retried even without a precondition: an attempt whose outcome is
        # uncertain is checked against the object, and the repeat is pinned.
        return await self.write(
            send,
            key,
            size=size,
            crc32c=crc,
            if_generation_match=if_generation_match,
            operation="put",
        )

    async def put_stream(
        self, key: str, chunks: AsyncIterator[bytes], *, content_type: str | None = None
    ) -> ObjectInfo:
        return await self.resumable_put_stream(
            self._upload_base, key, chunks, content_type, self._config.chunk_size
        )

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
        query = "fields=" + quote_name(INFO_FIELDS)
        if if_generation_match is not None:
            query += f"&ifGenerationMatch={if_generation_match}"
        url = yarl.URL(
            f"{self._object_base}{quote_name(destination)}/compose?{query}", encoded=True
        )
        headers = {"Content-Type": "application/json"}
        uri = self.uri(destination)

        # GCS checks that the sources are correctly assembled itself and
        # documents no checksum of the result to send with a compose (an MD5 is
        # ignored: https://cloud.google.com/storage/docs/composite-objects,
        # "Integrity checking composite objects"); the composite's CRC32C is
        # compared here with the combination of its sources'.
        expected = combined_crc32c(sources)

        async def attempt() -> ObjectInfo:
            _, _, resp = await self.request(
                "POST", url, operation="compose", uri=uri, headers=headers, data=body
            )
            info = _http.parse_info(resp, operation="compose", uri=uri)
            if expected is not None and info.crc32c is not None and info.crc32c != expected:
                raise IntegrityError(
                    f"the composite's CRC32C is {info.crc32c}, its sources' combine to {expected}",
                    operation="compose",
                    uri=uri,
                )
            return info

        if if_generation_match is None:
            # Without a precondition a repeat could not be told from another
            # writer's compose by its size alone: not retried.
            return await self.call(attempt, "compose", uri, idempotent=False)

        async def send(precondition: int | None) -> ObjectInfo:
            return await attempt()

        return await self.write(
            send,
            destination,
            size=sum(s.size for s in sources),
            crc32c=None,
            if_generation_match=if_generation_match,
            operation="compose",
        )

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        url = self._object_url(key, "" if generation is None else f"generation={generation}")
        await self.delete_request(url, "delete", self.uri(key), idempotent=generation is not None)

    async def copy(self, source: str, destination: str) -> ObjectInfo:
        base = (
            f"{self._object_base}{quote_name(source)}/rewriteTo/b/"
            f"{quote_name(self._bucket)}/o/{quote_name(destination)}?fields="
            + quote_name(f"done,rewriteToken,resource({INFO_FIELDS})")
        )
        uri = self.uri(destination)
        headers = {"Content-Type": "application/json"}
        token: str | None = None
        while True:
            url = yarl.URL(
                base + ("" if token is None else "&rewriteToken=" + quote_name(token)),
                encoded=True,
            )

            async def attempt(url: yarl.URL = url) -> dict[str, Any]:
                _, _, resp = await self.request(
                    "POST", url, operation="copy", uri=uri, headers=headers, data=b"{}"
                )
                return _http.parse_json(resp, operation="copy", uri=uri)

            # A repeated rewrite leaves the destination holding the source: safe.
            doc = await self.call(attempt, "copy", uri)
            if doc.get("done"):
                return object_info(doc["resource"])
            token = doc.get("rewriteToken")
            if not token:
                raise StorageError(
                    "rewrite answered neither done nor a token", operation="copy", uri=uri
                )

    # ------------------------------------------------------------ misc

    async def bucket_exists(self) -> bool | None:
        """Whether the bucket exists, asked of the bucket itself (``buckets.get``).

        Returns:
            ``True`` or ``False``; ``None`` when the credentials may not read the
            bucket's metadata (403: ``storage.buckets.get`` is in none of the
            object roles), so a bucket request cannot tell.
        """
        url = yarl.URL(f"{self._json_base}?fields=name", encoded=True)
        uri = self.uri()

        async def attempt() -> bool | None:
            status, _, _ = await self.request(
                "GET", url, operation="bucket get", uri=uri, allow=(403, 404)
            )
            return {403: None, 404: False}.get(status, True)

        return await self.call(attempt, "bucket get", uri)

    async def soft_delete_retention(self) -> int | None:
        """Seconds the bucket keeps deleted objects (its soft-delete policy); 0 if none.

        One bucket metadata request (``buckets.get``, class B) per process and
        bucket; the answer is kept for the process's life.

        Returns:
            The retention in seconds, 0 when soft delete is off, or ``None``
            when the credentials may not read the bucket's metadata (403).

        Raises:
            BucketNotFoundError: The bucket does not exist.
        """
        key = (self.endpoint, self.bucket)
        if key in _soft_delete_cache:
            return _soft_delete_cache[key]
        url = yarl.URL(f"{self._json_base}?fields=softDeletePolicy", encoded=True)
        uri = self.uri()

        async def attempt() -> int | None:
            status, _, body = await self.request(
                "GET", url, operation="bucket get", uri=uri, allow=(403,), bucket_op=True
            )
            if status == 403:
                return None
            doc = _http.parse_json(body, operation="bucket get", uri=uri)
            policy = doc.get("softDeletePolicy") or {}
            try:
                return int(policy.get("retentionDurationSeconds") or 0)
            except (TypeError, ValueError):
                return None

        seconds = await self.call(attempt, "bucket get", uri)
        _soft_delete_cache[key] = seconds
        return seconds

    async def close(self) -> None:
        await self.close_session()
