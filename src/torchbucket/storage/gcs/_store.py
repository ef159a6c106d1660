"""Google Cloud Storage over ``aiohttp``: ``gs://bucket/key``.

The JSON API serves listing, reads, simple and resumable uploads, compose,
delete, head and copy (rewrite); the XML API on the same host serves multipart
uploads. Credentials are Google application default credentials; with
``STORAGE_EMULATOR_HOST`` set (or an emulator endpoint given) requests go there,
anonymously.

:class:`GCSStore` owns one :class:`~._transport.GCSTransport` (how a request is
sent: session, credentials, limiter, retries, error mapping, the in-place
reader) and hands it to the module of each operation: :mod:`._reads`,
:mod:`._simple`, :mod:`._resumable`, :mod:`._multipart`, :mod:`._objects`,
:mod:`._bucket`. The store itself only checks arguments and picks the protocol.

Every request runs through :func:`torchbucket.retry.call` under the process's
adaptive limiter for the endpoint. A write is retried only where a repeat is
safe: by the protocol (resumable chunks, multipart parts), or with a generation
precondition. A write whose outcome is uncertain (no definite answer: a server
error, a reset, a timeout, a garbled answer) may have taken effect, so it is
resolved by the object itself: if the object holds exactly what was sent (size
and CRC32C), the write is accepted; otherwise a simple upload is repeated pinned
to the generation just seen (see :func:`._uncertain.write`). A multipart initiate
whose answer was lost aborts the empty uploads it may have left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from torchbucket.config import RetryConfig
from torchbucket.errors import NotFoundError
from torchbucket.storage._common import check_range
from torchbucket.storage.base import ListPage, MultipartUpload, ObjectInfo, Part, PartData
from torchbucket.storage.gcs import (
    _bucket,
    _head,
    _objects,
    _orphans,
    _reads,
    _resumable,
    _simple,
)
from torchbucket.storage.gcs._multipart import XMLMultipart
from torchbucket.storage.gcs._route import Router
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs.config import GCSConfig

__all__ = ["GCSStore"]


def _media_query(generation: int | None) -> str:
    return "alt=media" if generation is None else f"alt=media&generation={generation}"


class GCSStore:
    """An :class:`~torchbucket.storage.base.ObjectStore` on one GCS bucket.

    It has every protocol of :mod:`torchbucket.storage.capabilities`.

    Pickles as its bucket and config (spawn-safe); a forked child opens its own
    sessions and connections on first use (fork-safe).

    Args:
        bucket: The bucket name.
        config: Endpoint, credentials, retries and concurrency. Default
            ``GCSConfig()``.

    On a zonal (Rapid) bucket reads and writes take gRPC bidi streams (see
    ``GCSConfig.transport`` and :mod:`._zonal`).

    Attributes:
        unchecked_multipart_assembly: True on a regional bucket: GCS checks each part against
            its ``x-goog-hash`` but nothing checks the object a completion
            assembles (its request carries no hash:
            https://cloud.google.com/storage/docs/xml-api/post-object-complete),
            so a checkpoint writer assembles under a staging name and checks
            before the object takes the checkpoint's name. False on a zonal
            bucket, which has no multipart upload.
    """

    def __init__(self, bucket: str, *, config: GCSConfig | None = None) -> None:
        self._config = config or GCSConfig()
        self._transport = GCSTransport(bucket, self._config)
        self._multipart = XMLMultipart(self._transport)
        self._router = Router(self._transport, self._config)

    def __reduce__(self) -> tuple[Any, ...]:
        return (GCSStore, (self.bucket,), self._config)

    def __setstate__(self, state: GCSConfig) -> None:
        self.__init__(self.bucket, config=state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"GCSStore({self.bucket!r}, endpoint={self.endpoint!r})"

    @property
    def unchecked_multipart_assembly(self) -> bool:
        """True on a regional bucket; false on a zonal one, which has no multipart upload."""
        return not self._router.zonal_now()

    async def zonal(self) -> bool:
        """Whether the bucket is zonal (Rapid storage; see ``GCSConfig.transport``).

        Found out once per process (one ``buckets.get``) when ``transport`` is
        ``"auto"`` and a gRPC endpoint is known; ``"grpc"`` says yes.
        """
        return await self._router.zonal()

    async def zonal_orphans(
        self, prefix: str = "", *, older_than: float = 0.0, now: float | None = None
    ) -> list[tuple[ObjectInfo, float | None]]:
        """The data objects under ``torchbucket-zonal-objects/`` that no pointer names.

        What a zonal save killed before its pointer was written leaves (see
        :mod:`._orphans`): those of keys under ``prefix``, last written at least
        ``older_than`` seconds ago, with that time; none on a regional bucket.
        """
        return await _orphans.find_orphans(self._transport, prefix, older_than, now)

    async def remove_zonal_orphans(
        self, orphans: Sequence[tuple[ObjectInfo, float | None]]
    ) -> tuple[int, int]:
        """Delete ``orphans`` (pinned to the generation listed) that no pointer names still.

        Returns:
            How many data objects, and bytes, this call deleted.
        """
        return await _orphans.remove_orphans(self._transport, orphans)

    @property
    def config(self) -> GCSConfig:
        """The store's configuration."""
        return self._config

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._transport.bucket

    @property
    def endpoint(self) -> str:
        """The base URL requests go to."""
        return self._transport.endpoint

    @property
    def retry(self) -> RetryConfig:
        """How requests are retried (``config.retry``)."""
        return self._config.retry

    def uri(self, key: str = "") -> str:
        """``gs://bucket/key``."""
        return self._transport.urls.uri(key)

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
        if await self._router.grpc() is not None or await self._router.zonal():
            return await self._router.list_page(
                prefix, page_token, page_size, startOffset=start_offset, endOffset=end_offset
            )
        return await _bucket.list_page(
            self._transport,
            prefix,
            _bucket.LIST_FIELDS,
            page_token,
            page_size,
            startOffset=start_offset,
            endOffset=end_offset,
        )

    async def list_folder(
        self, prefix: str, *, page_token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        if await self._router.grpc() is not None or await self._router.zonal():
            return await self._router.list_page(prefix, page_token, page_size, delimiter="/")
        return await _bucket.list_page(
            self._transport, prefix, _bucket.FOLDER_FIELDS, page_token, page_size, delimiter="/"
        )

    async def head(self, key: str) -> ObjectInfo:
        grpc = await self._router.grpc()
        if grpc is not None:
            return await grpc.head(key)
        pointers = await self._router.json_pointers()
        if pointers is not None:
            return await pointers.head(key)
        return await _head.head(self._transport, key)

    async def get(
        self,
        key: str,
        *,
        start: int = 0,
        end: int | None = None,
        generation: int | None = None,
    ) -> bytes:
        check_range(start, end)
        if end == start:
            await self._check_exists(key, generation, "get")
            return b""
        grpc = await self._router.grpc()
        if grpc is not None:
            return await grpc.get(key, start, end, generation)
        return await self._router.json_read(
            key,
            generation,
            lambda name, gen: _reads.read(
                self._transport,
                self._transport.urls.object_url(name, _media_query(gen)),
                key,
                start,
                end,
            ),
        )

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        check_range(start, None)
        if len(buffer) == 0:
            await self._check_exists(key, generation, "get")
            return 0
        grpc = await self._router.grpc()
        if grpc is not None:
            return await grpc.get_into(key, buffer, start, generation)
        return await self._router.json_read(
            key,
            generation,
            lambda name, gen: _reads.read_into(
                self._transport,
                self._transport.urls.object_url(name, _media_query(gen)),
                key,
                start,
                buffer,
            ),
        )

    async def get_into_checked(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> tuple[int, int | None]:
        """``get_into``, and on the gRPC path the CRC32C of the bytes read (see
        ``SupportsCheckedReads``); ``None`` over the JSON API."""
        grpc = await self._router.grpc() if len(buffer) else None
        if grpc is None:
            return await self.get_into(key, buffer, start=start, generation=generation), None
        check_range(start, None)
        crc: list[int | None] = []
        count = await grpc.get_into(key, buffer, start, generation, crc)
        return count, crc[-1] if crc else None

    async def stream(
        self, key: str, *, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        check_range(start, end)
        if end == start:
            await self._check_exists(key, None, "stream")
            return
        grpc = await self._router.grpc()
        if grpc is not None:
            async for chunk in grpc.stream(key, start, end, chunk_size):
                yield chunk
            return
        name, pinned = await self._router.json_name(key, None)
        transport = self._transport
        async for chunk in _reads.stream(
            transport,
            lambda generation: transport.urls.object_url(name, _media_query(generation or pinned)),
            key,
            start,
            end,
            chunk_size,
        ):
            yield chunk

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
        grpc = await self._router.grpc()
        if grpc is not None:
            return await grpc.put(
                key, data, if_generation_match=if_generation_match, content_type=content_type
            )
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self._config.max_simple_upload_size:
            return await _resumable.put(
                self._transport,
                key,
                data,
                if_generation_match,
                content_type,
                self._config.upload_chunk_size,
            )
        return await _simple.put(
            self._transport, key, data, size, if_generation_match, content_type
        )

    async def put_stream(
        self, key: str, chunks: AsyncIterator[bytes], *, content_type: str | None = None
    ) -> ObjectInfo:
        grpc = await self._router.grpc()
        if grpc is not None:
            return await grpc.put_stream(key, chunks, content_type=content_type)
        return await _resumable.put_stream(
            self._transport, key, chunks, content_type, self._config.upload_chunk_size
        )

    async def compose(
        self,
        destination: str,
        sources: Sequence[ObjectInfo],
        *,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        await self._router.refuse("compose", destination)
        return await _objects.compose(
            self._transport, destination, sources, if_generation_match=if_generation_match
        )

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        await self._router.delete(key, generation)

    async def copy(
        self, source: str, destination: str, *, source_generation: int | None = None
    ) -> ObjectInfo:
        await self._router.refuse("copy", destination)
        return await _objects.copy(self._transport, source, destination, source_generation)

    async def created(self, key: str, *, generation: int | None = None) -> float | None:
        """When ``key`` (``generation`` of it, if given) was written, from its ``timeCreated``.

        One metadata request (``objects.get``, class B). ``torchbucket cleanup``
        asks it of the leftovers it finds, to spare those a running job may own.

        Returns:
            Seconds since the epoch, or ``None`` where the server gave no time.

        Raises:
            NotFoundError: No such object (or generation).
        """
        return await _objects.created(self._transport, key, generation)

    # ------------------------------------------------------------ multipart (XML API)

    async def multipart_initiate(self, key: str, *, content_type: str | None = None) -> str:
        await self._router.refuse("mpu_initiate", key)
        return await self._multipart.initiate(key, content_type=content_type)

    async def multipart_upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: PartData,
        *,
        crc32c: int | None = None,
    ) -> Part:
        return await self._multipart.upload_part(key, upload_id, number, data, crc32c=crc32c)

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        return await self._multipart.complete(key, upload_id, parts)

    async def multipart_abort(self, key: str, upload_id: str) -> None:
        await self._multipart.abort(key, upload_id)

    async def multipart_list(self, prefix: str = "") -> list[MultipartUpload]:
        if await self._router.zonal():
            return []  # a zonal bucket has no multipart uploads
        return await self._multipart.list_uploads(prefix)

    # ------------------------------------------------------------ the bucket

    async def bucket_exists(self) -> bool | None:
        """Whether the bucket exists, asked of the bucket itself (``buckets.get``).

        Returns:
            ``True`` or ``False``; ``None`` when the credentials may not read the
            bucket's metadata (403: ``storage.buckets.get`` is in none of the
            object roles), so a bucket request cannot tell.
        """
        return await _bucket.bucket_exists(self._transport)

    async def create_bucket(
        self, *, project: str | None = None, location: str | None = None
    ) -> None:
        """Create this store's bucket (``buckets.insert``).

        Args:
            project: The project that owns it; default ``GCSConfig.project``,
                else ``$GOOGLE_CLOUD_PROJECT`` (or gcloud's
                ``$CLOUDSDK_CORE_PROJECT``); required on Google's endpoint,
                any on an emulator.
            location: A GCS location (``US``, ``europe-west4``...); default GCS's.

        Raises:
            BucketExistsError: It exists already (HTTP 409), yours or anyone's.
            ConfigError: No project is known and the endpoint is Google's.
        """
        await _bucket.create_bucket(self._transport, project=project, location=location)

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
        return await _bucket.soft_delete_retention(self._transport)

    async def close(self) -> None:
        await self._router.close()
        await self._transport.close()
