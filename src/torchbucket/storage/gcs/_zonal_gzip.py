"""Objects stored with ``Content-Encoding: gzip`` on the gRPC path: returned decoded.

GCS's gRPC API does not transcode. ``ReadObject`` and ``BidiReadObject``
serve a gzip-encoded object's stored bytes, ranges over them, each chunk with
the CRC32C of those bytes; ``Object.content_encoding`` says ``gzip``
(google.storage.v2's storage.proto has no ``Accept-Encoding``). The clients
built on it hand those stored bytes over: google-cloud-storage's
``AsyncMultiRangeDownloader``, and gcsfs's ``ZonalFile`` through it;
google-cloud-cpp's transcoding tests stop where they would read over gRPC
("decompressive transcoding does not work with gRPC"), and Go's gRPC reader
leaves it as a TODO.

torchbucket's JSON path returns the decoded bytes, what google-cloud-storage's
``download_as_bytes()`` returns (:mod:`._gzip`): a dataset must not change
bytes when its bucket becomes zonal. So the gRPC path decodes too, as the JSON
path does with the stored bytes it asks for: every chunk checked against its
CRC32C as on any gRPC read, then decoded (a gzip that does not decode is an
error naming the object). Offsets of a ranged read are offsets into the
decoded bytes; a range of the stored bytes is none of those, so such a read
reads the whole object, pinned to the generation it found, and cuts the range
from it. A read learns the encoding from the object's metadata, which comes
before its bytes: a read of a range (or a stream) of a gzip-encoded object
costs that first range more; a whole read costs nothing more.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, cast

from torchbucket.storage.base import TRANSCODED_ENCODINGS
from torchbucket.storage.gcs._grpc_data import Meta
from torchbucket.storage.gcs._grpc_wire import CHUNK_LIMIT
from torchbucket.storage.gcs._gzip import decode_range, gunzip
from torchbucket.storage.gcs._zonal import GrpcPath

__all__ = ["DecodingGrpcPath"]


class _Probe:
    """What the reads of one call saw (``meta``); ``stop``: end a gzip-encoded one."""

    __slots__ = ("meta", "stop")

    def __init__(self, *, stop: bool = False) -> None:
        self.meta: Meta | None = None
        self.stop = stop


_PROBE: contextvars.ContextVar[_Probe | None] = contextvars.ContextVar(
    "torchbucket_gzip_probe", default=None
)


class _Encoded(Exception):
    """A probed read found a gzip-encoded object (its bytes are not the ones asked)."""

    def __init__(self, meta: Meta) -> None:
        super().__init__(meta.generation)
        self.meta = meta


@contextlib.contextmanager
def _probing(probe: _Probe) -> Iterator[_Probe]:
    token = _PROBE.set(probe)
    try:
        yield probe
    finally:
        _PROBE.reset(token)


def _gzipped(meta: Meta | None) -> bool:
    return meta is not None and meta.content_encoding in TRANSCODED_ENCODINGS


class DecodingGrpcPath(GrpcPath):
    """:class:`GrpcPath` whose reads return a gzip-encoded object decoded (see the module)."""

    async def _read(
        self,
        key: str,
        start: int,
        end: int | None,
        generation: int | None,
        sink: Any,
        crc: list[int | None] | None = None,
    ) -> tuple[int, Meta | None]:
        count, meta = await super()._read(key, start, end, generation, sink, crc)
        probe = _PROBE.get()
        if probe is not None:
            probe.meta = meta
            if probe.stop and _gzipped(meta):
                assert meta is not None
                raise _Encoded(meta)
        return count, meta

    async def _whole(self, key: str, generation: int | None) -> bytes:
        """The whole object, decoded if it is gzip-encoded (one read, hedge-safe sink)."""
        buf = bytearray()

        def sink(offset: int, data: bytes | memoryview) -> None:
            buf[offset : offset + len(data)] = data  # a winning hedge rewrites from its start

        with _probing(_Probe()) as probe:
            await self._read(key, 0, None, generation, sink)
        return gunzip(buf, self._t.urls.uri(key)) if _gzipped(probe.meta) else bytes(buf)

    async def _encoded_after_416(self, key: str, start: int, generation: int | None) -> int | None:
        """A read at ``start`` found nothing: the generation to decode, if gzip-encoded.

        ``start`` was past the stored end, which a gzip object's decoded bytes
        may go beyond (the JSON path asks the same after a 416).
        """
        if not start:
            return None
        info = await self.head(key)
        if info.transcoded and generation in (None, info.generation):
            return info.generation
        return None

    async def get(self, key: str, start: int, end: int | None, generation: int | None) -> bytes:
        with _probing(_Probe()) as probe:
            data = await super().get(key, start, end, generation)
        meta = probe.meta
        if _gzipped(meta):
            assert meta is not None
            if start == 0 and end is None:
                return gunzip(data, self._t.urls.uri(key))
            return (await self._whole(key, meta.generation))[start:end]
        if meta is None:
            found = await self._encoded_after_416(key, start, generation)
            if found is not None:
                return (await self._whole(key, found))[start:end]
        return data

    async def get_into(
        self,
        key: str,
        buffer: memoryview,
        start: int,
        generation: int | None,
        crc: list[int | None] | None = None,
    ) -> int:
        """Read into ``buffer``; for a gzip-encoded object ``crc`` gets ``None``
        (GCS has no CRC32C of the decoded bytes; the stored ones were checked)."""
        with _probing(_Probe()) as probe:
            count = await super().get_into(key, buffer, start, generation, crc)
        meta = probe.meta
        found = meta.generation if meta is not None and _gzipped(meta) else None
        if meta is None:
            found = await self._encoded_after_416(key, start, generation)
        if found is None:
            return count
        out = buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
        piece = (await self._whole(key, found))[start : start + len(out)]
        out[: len(piece)] = piece
        if crc is not None:
            crc.append(None)
        return len(piece)

    async def stream(
        self, key: str, start: int, end: int | None, chunk_size: int
    ) -> AsyncIterator[bytes]:
        # GrpcPath.stream is an async generator: closed here if this one is.
        inner = cast("AsyncGenerator[bytes, None]", super().stream(key, start, end, chunk_size))
        found: int | None = None
        async with contextlib.aclosing(inner):
            with _probing(_Probe(stop=True)) as probe:
                try:
                    first: bytes | None = await inner.__anext__()
                except StopAsyncIteration:
                    first = None
                except _Encoded as encoded:
                    first, found = None, encoded.meta.generation
            if first is not None:
                yield first
                async for chunk in inner:
                    yield chunk
                return
        if found is None and probe.meta is None:
            found = await self._encoded_after_416(key, start, None)
        if found is None:
            return
        stored = self._stored(key, found, max(chunk_size, CHUNK_LIMIT))
        async for piece in decode_range(self._t.urls.uri(key), stored, start, end):
            yield piece

    async def _stored(
        self, key: str, generation: int, window: int
    ) -> AsyncGenerator[bytes | bytearray | memoryview, None]:
        """The stored bytes of ``key`` at ``generation`` from offset 0, ``window`` at a time."""
        pos = 0
        while True:
            buf = bytearray()

            def sink(
                offset: int, data: bytes | memoryview, at: int = pos, out: bytearray = buf
            ) -> None:
                out[offset - at : offset - at + len(data)] = data

            count, _ = await self._read(key, pos, pos + window, generation, sink)
            if count:
                yield buf
            pos += count
            if count < window:
                return
