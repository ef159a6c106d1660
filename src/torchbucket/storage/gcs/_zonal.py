"""The GCS store's gRPC path: reads and writes of a zonal (Rapid) bucket.

Reads go over ``BidiReadObject`` (:mod:`._grpc_read`), writes over
``BidiWriteObject`` into appendable objects (:mod:`._grpc_write`); listing,
metadata and deletes stay on the JSON API, which zonal buckets serve.

A write that fits one message (2 MiB) is one request that creates, fills and
finalizes the object at once: there is no moment at which the name holds a
partial object. A larger write (``put_stream``, a checkpoint) cannot be made
so, and a zonal bucket has neither compose nor rewrite to put a checked object
in place afterwards; and an appendable object is live, under its name, from
its first message, replacing what the name held. So such a write goes to a
data object of its own under ``torchbucket-zonal-objects/<key>/<id>``
(hidden from listings), is finalized only once the server holds every byte
and its size and CRC32C are checked, and only then does ``key`` become a
*pointer*: a one-message object whose metadata names the data object, its
generation, size and CRC32C. A failed or killed write leaves ``key`` as it
was (the old checkpoint loads unchanged) and at worst an orphan data object
under the hidden prefix. Pointers are invisible to callers: listings and
``head`` report the data object's size, CRC32C and generation under the
pointer's name, reads follow them, and deleting the name deletes both.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from torchbucket.errors import NotFoundError, StorageError
from torchbucket.runtime import accounting
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.crc32c import b64
from torchbucket.storage.gcs._grpc_data import Meta
from torchbucket.storage.gcs._grpc_hedge import Parts
from torchbucket.storage.gcs._grpc_hedge import attempt as hedged
from torchbucket.storage.gcs._grpc_read import RangeRead, ReadStreams
from torchbucket.storage.gcs._grpc_wire import (
    CHUNK_LIMIT,
    Channels,
    bucket_path,
    error_for_rpc,
    grpc_target,
    hold,
    pb,
)
from torchbucket.storage.gcs._grpc_write import FLUSH_CHUNKS, Writer, write, write_once
from torchbucket.storage.gcs._pointers import (
    POINTER_PREFIX,
    data_name,
    listed_info,
    pointed,
    pointer_metadata,
)
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs.config import GCSConfig

__all__ = ["POINTER_PREFIX", "GrpcPath", "grpc_target", "listed_info", "pointed"]

logger = logging.getLogger(__name__)


class _Followed(StorageError):
    """A read met a pointer: read its data object instead."""

    def __init__(self, target: tuple[str, int, int, str | None]) -> None:
        super().__init__("pointer", operation="get")
        self.target = target


class GrpcPath:
    """Reads and writes of one bucket over gRPC (see the module).

    Args:
        transport: The store's JSON API transport (credentials, limiter,
            retries, listing and metadata).
        config: The store's configuration.
        target: ``(host:port, secure)`` of the gRPC endpoint.
    """

    def __init__(
        self, transport: GCSTransport, config: GCSConfig, target: tuple[str, bool]
    ) -> None:
        self._t = transport
        self._config = config
        self.channels = Channels(target[0], secure=target[1], bucket=transport.bucket)
        self._reads = ReadStreams(
            self.channels,
            transport.bucket,
            self._metadata,
            transport.urls.uri,
            transport.read_timeout,
        )
        hold(self)  # its streams must outlive a fork in the child (see _grpc_wire)
        #: name -> pointer target seen by head or a read, for pinned reads.
        self._pointers: dict[str, tuple[str, int, int, str | None]] = {}

    async def _metadata(self) -> tuple[tuple[str, str], ...]:
        headers = await self._t.headers(None, "get", self._t.urls.uri())
        extra = tuple((k.lower(), v) for k, v in (headers or {}).items())
        return (self.channels.routing, *extra)

    def _check_pointer(self, key: str, meta: Meta) -> None:
        target = pointed(meta.metadata, key)
        if target is not None:
            self._pointers[key] = target
            raise _Followed(target)

    # ------------------------------------------------------------ reads

    async def _read(
        self,
        key: str,
        start: int,
        end: int | None,
        generation: int | None,
        sink: Any,
        crc: list[int | None] | None = None,
    ) -> tuple[int, Meta | None]:
        """Read ``[start, end)`` of ``key`` into ``sink``; ``(bytes, meta)``, following pointers.

        ``crc`` gets the bytes' CRC32C appended, from the chunks' (``RangeRead.crc_all``).
        """
        name, gen = key, generation
        known = self._pointers.get(key)
        if known is not None and (generation is None or known[1] == generation):
            name, gen = known[0], known[1]
        elif generation is not None and known is not None:
            raise NotFoundError(
                f"generation {generation} is gone",
                operation="get",
                uri=self._t.urls.uri(key),
                status=404,
            )
        asked = False  # the name asked again after its remembered data object was gone
        for _ in range(4):
            read = RangeRead(start, end, sink, crc_all=crc is not None)
            try:
                meta = await self._t.call(
                    functools.partial(
                        hedged, self._reads, self._t.hedger, name, gen, read, self._on_meta(key)
                    ),
                    "get",
                    self._t.urls.uri(key),
                )
            except _Followed as followed:
                if generation is not None and followed.target[1] != generation:
                    raise NotFoundError(
                        f"generation {generation} is gone",
                        operation="get",
                        uri=self._t.urls.uri(key),
                        status=404,
                    ) from None
                name, gen = followed.target[0], followed.target[1]
                continue
            except StorageError as exc:
                if name == key and (
                    exc.status == 416 or (generation is not None and isinstance(exc, NotFoundError))
                ):
                    # An empty pointer refuses the range, and a pinned read
                    # names its data object's generation: ask the name (unless
                    # a concurrent read of it just did).
                    if key not in self._pointers:
                        await self.head(key)
                    known = self._pointers.get(key)
                    if known is not None and (generation is None or known[1] == generation):
                        name, gen = known[0], known[1]
                        continue
                if exc.status == 416:
                    return 0, None
                if isinstance(exc, NotFoundError) and name != key:
                    self._pointers.pop(key, None)  # replaced since: ask the name again
                    if generation is None and not asked:
                        asked, name, gen = True, key, None
                        continue
                    exc.uri = self._t.urls.uri(key)
                raise
            if crc is not None:
                crc.append(read.crc if read.crc_known else None)
            return read.pos - start, meta
        raise StorageError("a pointer names a pointer", operation="get", uri=self._t.urls.uri(key))

    def _on_meta(self, key: str) -> Any:
        def check(_name: str, meta: Meta) -> None:
            self._check_pointer(key, meta)

        return check

    async def get(self, key: str, start: int, end: int | None, generation: int | None) -> bytes:
        parts = Parts()  # a hedge that wins hands over its chunks (see _grpc_hedge)
        await self._read(key, start, end, generation, parts.sink)
        return parts.join()

    async def get_into(
        self,
        key: str,
        buffer: memoryview,
        start: int,
        generation: int | None,
        crc: list[int | None] | None = None,
    ) -> int:
        """Read into ``buffer``; ``crc`` gets the bytes' CRC32C (see ``_read``)."""
        out = buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer

        def sink(offset: int, data: bytes | memoryview) -> None:
            at = offset - start
            out[at : at + len(data)] = data

        count, _ = await self._read(key, start, start + len(out), generation, sink, crc)
        return count

    async def stream(
        self, key: str, start: int, end: int | None, chunk_size: int
    ) -> AsyncIterator[bytes]:
        # Windows of ``chunk_size`` (at least 2 MiB), one generation throughout.
        window = max(chunk_size, CHUNK_LIMIT)
        pos, generation = start, None
        while end is None or pos < end:
            stop = pos + window if end is None else min(end, pos + window)
            parts = Parts()
            count, meta = await self._read(key, pos, stop, generation, parts.sink)
            if meta is not None:
                generation = meta.generation
            for part in parts.chunks:
                yield part
            pos += count
            if count < stop - (pos - count):
                return

    async def head(self, key: str) -> ObjectInfo:
        """The object's metadata over ``GetObject``, a pointer's data object's for a pointer."""
        uri = self._t.urls.uri(key)
        m = pb()

        async def attempt() -> Any:
            accounting.count("head")
            try:
                return await self.channels.method("GetObject")(
                    m.GetObjectRequest(bucket=bucket_path(self._t.bucket), object_=key),
                    metadata=await self._metadata(),
                    timeout=self._config.retry.attempt_timeout,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise error_for_rpc(exc, operation="head", uri=uri) from exc

        obj = await self._t.call(attempt, "head", uri)
        target = pointed(dict(obj.metadata), key)
        if target is not None:
            self._pointers[key] = target
            _, generation, size, crc = target
            return ObjectInfo(key, size, generation, crc, obj.storage_class or None)
        self._pointers.pop(key, None)
        crc = b64(obj.checksums.crc32c) if obj.checksums.HasField("crc32c") else None
        sc, encoding = obj.storage_class or None, obj.content_encoding or None
        return ObjectInfo(key, obj.size, obj.generation, crc, sc, encoding)

    # ------------------------------------------------------------ writes

    def _writer(self, key: str, **kw: Any) -> Writer:
        w = Writer(
            self.channels,
            self._t.bucket,
            key,
            self._metadata,
            self._t.urls.uri(key),
            flush_every=FLUSH_CHUNKS * self._config.upload_chunk_size,
            **kw,
        )
        w.config = self._config.retry
        w.limiter = self._t.loop_state()[2]
        w.budget = self._t.job_budget()
        return w

    async def _one_message(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None,
        metadata: dict[str, str] | None = None,
        if_generation_match: int | None = None,
    ) -> Meta:
        writer = self._writer(
            key,
            content_type=content_type,
            object_metadata=metadata,
            if_generation_match=if_generation_match,
        )
        return await self._t.call(
            lambda: write_once(writer, data),
            "put",
            self._t.urls.uri(key),
            idempotent=if_generation_match is None,
        )

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_generation_match: int | None,
        content_type: str | None,
    ) -> ObjectInfo:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > CHUNK_LIMIT:

            async def one() -> AsyncIterator[bytes | bytearray | memoryview]:
                yield data

            return await self.put_stream(
                key, one(), content_type=content_type, if_generation_match=if_generation_match
            )
        meta = await self._one_message(
            key, bytes(data), content_type=content_type, if_generation_match=if_generation_match
        )
        self._pointers.pop(key, None)
        return ObjectInfo(key, meta.size, meta.generation, b64(meta.crc32c or 0))

    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterator[bytes | bytearray | memoryview],
        *,
        content_type: str | None,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        """Write a data object, check it, then point ``key`` at it (see the module).

        The data object ``key`` pointed at before is deleted once the new
        pointer is in place (asked of the bucket, not only remembered: a fresh
        process replacing a checkpoint leaves one data object, not two).
        """
        name = data_name(key)
        writer = self._writer(name, content_type=content_type, if_generation_match=0)
        asked: list[asyncio.Task[tuple[str, int, int, str | None] | None]] = []

        async def then_ask() -> AsyncIterator[bytes | bytearray | memoryview]:
            async for chunk in chunks:
                yield chunk
            # Asked while the data object is finalized, not after: a round trip less.
            asked.append(asyncio.ensure_future(self._target_of(key)))

        try:
            meta = await write(writer, then_ask())
        except BaseException as exc:
            for task in asked:
                task.cancel()
            await asyncio.gather(*asked, return_exceptions=True)
            await self._forget(name, None)
            if isinstance(exc, StorageError):
                exc.uri = self._t.urls.uri(key)  # the caller's name, not the hidden one
            raise
        try:
            previous = await (asked[0] if asked else self._target_of(key))
        except StorageError:  # left over if so: ``torchbucket cleanup`` finds it
            previous = self._pointers.get(key)
        crc = b64(meta.crc32c) if meta.crc32c is not None else None
        pointer = pointer_metadata(name, meta.generation, meta.size, crc)
        try:
            await self._one_message(
                key,
                b"",
                content_type=content_type,
                metadata=pointer,
                if_generation_match=if_generation_match,
            )
        except BaseException:
            await self._forget_unless_pointed(key, name, meta.generation)
            raise
        self._pointers[key] = (name, meta.generation, meta.size, crc)
        if previous is not None and previous[0] != name:
            await self._forget(previous[0], previous[1])
        return ObjectInfo(key, meta.size, meta.generation, crc)

    async def _target_of(self, key: str) -> tuple[str, int, int, str | None] | None:
        """The data object ``key`` points at now, asked of the bucket (``None``: not a pointer)."""
        try:
            await self.head(key)
        except NotFoundError:
            self._pointers.pop(key, None)
        return self._pointers.get(key)

    async def _forget_unless_pointed(self, key: str, name: str, generation: int) -> None:
        """A pointer write failed: delete its data object, unless it took effect after all."""
        try:
            target = await self._target_of(key)
        except (StorageError, asyncio.CancelledError):
            return  # unknown: leave it; ``torchbucket cleanup`` removes it if no pointer names it
        if target is None or target[0] != name:
            await self._forget(name, generation)

    async def delete(self, key: str, generation: int | None) -> None:
        """Delete ``key`` over ``DeleteObject``; a 404 after a lost answer means done.

        Raises:
            NotFoundError: The first attempt found nothing to delete.
        """
        uri = self._t.urls.uri(key)
        request = pb().DeleteObjectRequest(bucket=bucket_path(self._t.bucket), object_=key)
        if generation is not None:
            request.generation = generation
        ambiguous = False

        async def attempt() -> None:
            nonlocal ambiguous
            accounting.count("delete")
            try:
                await self.channels.method("DeleteObject")(
                    request,
                    metadata=await self._metadata(),
                    timeout=self._config.retry.attempt_timeout,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = error_for_rpc(exc, operation="delete", uri=uri)
                if isinstance(error, NotFoundError) and ambiguous:
                    return  # a retry of a delete whose answer was lost
                ambiguous = ambiguous or not isinstance(error, NotFoundError)
                raise error from exc

        await self._t.call(attempt, "delete", uri)

    async def _forget(self, name: str, generation: int | None) -> None:
        """Delete a data object no name points at (a failure is logged, not raised)."""
        try:
            await self.delete(name, generation)
        except (NotFoundError, asyncio.CancelledError):
            pass
        except StorageError:
            logger.warning(
                "could not delete %s; it is left over", self._t.urls.uri(name), exc_info=True
            )

    async def after_delete(self, key: str) -> None:
        """``key`` was deleted: delete the data object it pointed at, if it was a pointer."""
        target = self._pointers.pop(key, None)
        if target is not None:
            await self._forget(target[0], target[1])

    def pointer_of(self, key: str) -> tuple[str, int, int, str | None] | None:
        """The data object ``key`` was last seen pointing at."""
        return self._pointers.get(key)

    async def close(self) -> None:
        await self.channels.close()
