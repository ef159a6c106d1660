"""gRPC reads: ``GetObject``, ``ListObjects``, ``ReadObject`` and ``BidiReadObject``.

What the emulator relies on (google.storage.v2's storage.proto, as shipped in
google-cloud-storage 3.x's ``_storage_v2``, and its asyncio readers):

- ``BidiReadObject``: the first request carries ``read_object_spec``; the first
  response carries the object's ``metadata`` (not when the stream was opened
  with a ``read_handle``) and a ``read_handle``. Each ``ReadRange`` (up to 100
  per request) is answered by ``ObjectRangeData`` messages in increasing offset
  order, each chunk (at most 2 MiB) with its CRC32C, the last with
  ``range_end``; ranges interleave. A negative offset counts back from the end;
  an offset past the end, or a negative length, is OUT_OF_RANGE, which ends
  the stream. The stream ends once the client has half-closed and every range
  is answered.
- ``ReadObject``: the first message carries ``metadata``, ``object_checksums``
  and, for a ranged read, ``content_range``.
- No transcoding: an object stored with ``Content-Encoding: gzip`` is served
  as stored, ranges over the stored bytes, its ``content_encoding`` in the
  metadata (the gRPC API has no ``Accept-Encoding``; google-cloud-storage's
  asyncio readers hand the stored bytes over). Only the HTTP side transcodes.

Faults (rules on ``get``; a bidi stream's open and each of its ranges are a
request each): a status kind fails the stream with its code, ``reset`` with
UNAVAILABLE before any data, ``truncate`` with UNAVAILABLE after half the
range's data (a stream broken mid-read: the client resumes from the last byte
it got), ``corrupt`` flips a byte of one chunk and leaves its CRC32C as it was
(what a client's per-chunk check exists for).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import google_crc32c
import grpc

from torchbucket.emulator._grpc_common import (
    CHUNK,
    RpcError,
    bucket_of,
    make_handle,
    object_proto,
    pb,
    preconditions,
    read_handle_ok,
)
from torchbucket.emulator._model_store import ModelObject
from torchbucket.emulator._pieces import Pieces, sliceable
from torchbucket.emulator._zonal import AppendableObject

if TYPE_CHECKING:
    from torchbucket.emulator._grpc_server import GrpcFront, Tally

__all__ = ["ReadApi"]

_MAX_PAGE = 1000
_MAX_RANGES = 100
# Responses a bidi stream holds before its ranges wait for the client (2 MiB each).
_QUEUE = 16
_DONE = object()


def _size(obj: ModelObject) -> int:
    return obj.size if isinstance(obj, AppendableObject) else len(obj.data)


def _span(offset: int, length: int, size: int) -> tuple[int, int]:
    """``(start, end)`` of a read of ``length`` bytes (0: to the end) at ``offset``."""
    if length < 0:
        raise RpcError(grpc.StatusCode.OUT_OF_RANGE, f"read length {length} is negative")
    start = max(0, size + offset) if offset < 0 else offset
    if start > size:
        raise RpcError(
            grpc.StatusCode.OUT_OF_RANGE, f"read offset {offset} is past the object's end ({size})"
        )
    end = size if length == 0 else min(size, start + length)
    return start, end


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def range_message(content: bytes, crc: int, offset: int, read_id: int, end: bool) -> bytes:
    """A serialized ``BidiReadObjectResponse`` with one ``ObjectRangeData``.

    Written in protobuf's wire format rather than built as a message: the
    content is copied once (into the answer gRPC sends), not into a message
    and again by its serialization, so the emulator's CPU per MiB served
    stays closer to what a client costs (what the benchmarks compare). The
    content comes last (fields may come in any order). Fields:
    ``object_data_ranges`` = 6; ``ObjectRangeData``: ``checksummed_data`` = 1
    (``content`` = 1, ``crc32c`` = 2), ``read_range`` = 2 (``read_offset`` = 1,
    ``read_length`` = 2, ``read_id`` = 3), ``range_end`` = 3.
    """
    n = len(content)
    rr = b"".join((b"\x08", _varint(offset), b"\x10", _varint(n), b"\x18", _varint(read_id)))
    length = _varint(n)
    head = b"".join(
        (
            b"\x12",
            _varint(len(rr)),
            rr,
            b"\x18\x01" if end else b"",
            b"\x0a",
            _varint(5 + 1 + len(length) + n),
            b"\x15",
            crc.to_bytes(4, "little"),
            b"\x0a",
            length,
        )
    )
    return b"".join((b"\x32", _varint(len(head) + n), head, content))


def _chunk(data: memoryview | Pieces, start: int, end: int, corrupt: bool) -> tuple[bytes, int]:
    content = bytes(data[start:end])
    crc = google_crc32c.value(content)
    if corrupt and content:
        flipped = bytearray(content)
        flipped[len(flipped) // 2] ^= 0xFF
        content = bytes(flipped)  # the CRC32C stays the original's
    return content, crc


class ReadApi:
    """The read RPCs of one :class:`GrpcFront`."""

    def __init__(self, front: GrpcFront) -> None:
        self.g = front
        self.store = front.store

    def _object(self, bucket: str, name: str, generation: int, pre_source: Any) -> ModelObject:
        obj = self.store.get(bucket, name, generation or None)
        preconditions(pre_source).check(obj, "object")
        return obj

    def _zonal(self, bucket: str) -> bool:
        return bool(self.store.bucket(bucket).zonal)

    async def get_object(self, request: Any, context: Any, tally: Tally) -> Any:
        """``GetObject``: the object's metadata (a ``head``)."""
        bucket = bucket_of(request.bucket)
        await self.g.admit(context, tally, "head", bucket, request.object_)
        await self.g.first_byte("head")
        if request.soft_deleted:  # the model store keeps no soft-deleted objects
            raise RpcError(
                grpc.StatusCode.NOT_FOUND, f"No soft-deleted object {bucket}/{request.object_}"
            )
        obj = self._object(bucket, request.object_, request.generation, request)
        return object_proto(obj, zonal=self._zonal(bucket))

    async def list_objects(self, request: Any, context: Any, tally: Tally) -> Any:
        """``ListObjects``: one page (at most 1,000 entries, as GCS caps them)."""
        bucket = bucket_of(request.parent)
        await self.g.admit(context, tally, "list", bucket, request.prefix)
        if request.match_glob or request.filter:
            raise RpcError(
                grpc.StatusCode.UNIMPLEMENTED,
                "match_glob and filter are not served by the emulator",
            )
        size = request.page_size if 0 < request.page_size <= _MAX_PAGE else _MAX_PAGE
        await self.g.first_byte("list")
        items, prefixes, token = self.store.list_page(
            bucket,
            prefix=request.prefix,
            start_offset=request.lexicographic_start,
            end_offset=request.lexicographic_end,
            page_token=request.page_token,
            max_results=size,
            delimiter=request.delimiter,
        )
        zonal = self._zonal(bucket)
        out = pb.ListObjectsResponse()
        out.objects.extend([object_proto(o, zonal=zonal) for o in items])
        out.prefixes.extend(prefixes)
        if token:
            out.next_page_token = token
        return out

    async def read_object(self, request: Any, context: Any, tally: Tally) -> AsyncIterator[Any]:
        """``ReadObject``: one range of one object, streamed in checksummed chunks."""
        bucket = bucket_of(request.bucket)
        rule = await self.g.admit(context, tally, "get", bucket, request.object_)
        obj = self._object(bucket, request.object_, request.generation, request)
        if request.read_limit < 0:
            raise RpcError(
                grpc.StatusCode.OUT_OF_RANGE, f"read_limit {request.read_limit} is negative"
            )
        size = _size(obj)
        start, end = _span(request.read_offset, request.read_limit, size)
        await self.g.first_byte("get")
        kind = rule.kind if rule is not None else None
        data = sliceable(obj.data)
        first = pb.ReadObjectResponse()
        first.metadata.CopyFrom(object_proto(obj, zonal=self._zonal(bucket)))
        first.object_checksums.CopyFrom(first.metadata.checksums)
        if request.read_offset or request.read_limit:
            first.content_range.start = start
            first.content_range.end = end
            first.content_range.complete_length = size
        half = start + (end - start) // 2
        pos = start
        message = first
        while True:
            stop = min(end, pos + CHUNK)
            if kind == "truncate" and stop > half:
                stop = half
            content, crc = _chunk(data, pos, stop, kind == "corrupt" and pos <= half < stop)
            message.checksummed_data.content = content
            message.checksummed_data.crc32c = crc
            await self.g.transfer(len(content))
            tally.sent(len(content))
            yield message
            pos = stop
            if kind == "truncate" and pos >= half:
                raise RpcError(
                    grpc.StatusCode.UNAVAILABLE, "Stream broken mid-read (injected fault)."
                )
            if pos >= end:
                return
            message = pb.ReadObjectResponse()

    async def bidi_read(self, requests: Any, context: Any, tally: Tally) -> AsyncIterator[Any]:
        """``BidiReadObject``: many ranges of one object on one stream."""
        it = requests.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            return
        if not first.HasField("read_object_spec"):
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT, "the first message needs read_object_spec"
            )
        spec = first.read_object_spec
        bucket = bucket_of(spec.bucket)
        await self.g.admit(context, tally, "get", bucket, spec.object_)
        tally.op = "get"
        by_handle = spec.HasField("read_handle") and bool(spec.read_handle.handle)
        generation = spec.generation
        if by_handle:
            named = read_handle_ok(b"rh", spec.read_handle.handle, bucket, spec.object_)
            if named is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "read_handle names another object")
            generation = generation or named
        await self.g.first_byte("head")
        obj = self._object(bucket, spec.object_, generation, spec)
        opened = pb.BidiReadObjectResponse()
        if not by_handle:
            opened.metadata.CopyFrom(object_proto(obj, zonal=self._zonal(bucket)))
        opened.read_handle.handle = make_handle(b"rh", obj)
        yield opened
        stream = _BidiRead(self.g, obj, bucket, tally)
        async for message in stream.run(first, it):
            yield message


class _BidiRead:
    """The ranges of one bidi read stream, served concurrently into one queue."""

    def __init__(self, g: GrpcFront, obj: ModelObject, bucket: str, tally: Tally) -> None:
        self.g = g
        self.obj = obj
        self.bucket = bucket
        self.tally = tally
        self.out: asyncio.Queue[Any] = asyncio.Queue(maxsize=_QUEUE)
        self.tasks: set[asyncio.Task[None]] = set()
        self.ids: set[int] = set()

    def _start(self, ranges: Any) -> None:
        if len(ranges) > _MAX_RANGES:
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(ranges)} read ranges in one message (max 100)",
            )
        for r in ranges:
            if r.read_id in self.ids:
                raise RpcError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"read_id {r.read_id} is already in use"
                )
            self.ids.add(r.read_id)
            self.g.front.stats.by_rpc["BidiReadObject.ranges"] += 1
            task = asyncio.ensure_future(self._range(r.read_offset, r.read_length, r.read_id))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def run(self, first: Any, it: Any) -> AsyncIterator[Any]:
        """Yield every response until the client is done and every range answered."""
        self._start(first.read_ranges)
        reader = asyncio.ensure_future(self._read(it))
        try:
            while True:
                item = await self.out.get()
                if isinstance(item, RpcError):
                    raise item
                if item is _DONE:  # put once every range has put its last message
                    return
                yield item
        finally:
            reader.cancel()
            for task in list(self.tasks):
                task.cancel()

    async def _read(self, it: Any) -> None:
        try:
            async for request in it:
                if request.HasField("read_object_spec"):
                    raise RpcError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "read_object_spec only in the first message",
                    )
                self._start(request.read_ranges)
        except RpcError as exc:
            await self.out.put(exc)
            return
        with contextlib.suppress(asyncio.CancelledError):
            while self.tasks:
                await asyncio.gather(*list(self.tasks), return_exceptions=True)
        await self.out.put(_DONE)

    async def _range(self, offset: int, length: int, read_id: int) -> None:
        try:
            await self._serve(offset, length, read_id)
        except RpcError as exc:
            await self.out.put(exc)

    async def _serve(self, offset: int, length: int, read_id: int) -> None:
        g, obj = self.g, self.obj
        rule = await g.fault("get", self.bucket, obj.name)
        kind = rule.kind if rule is not None else None
        start, end = _span(offset, length, _size(obj))
        await g.first_byte("get")
        data = sliceable(obj.data)
        half = start + (end - start) // 2
        pos = start
        while True:
            stop = min(end, pos + CHUNK)
            if kind == "truncate" and stop > half:
                stop = half
            content, crc = _chunk(data, pos, stop, kind == "corrupt" and pos <= half < stop)
            last = stop >= end and kind != "truncate"
            message = range_message(content, crc, pos, read_id, last)
            await g.transfer(len(content))
            self.tally.sent(len(content))
            await self.out.put(message)
            pos = stop
            if kind == "truncate" and pos >= half:
                raise RpcError(
                    grpc.StatusCode.UNAVAILABLE, "Stream broken mid-read (injected fault)."
                )
            if pos >= end:
                return
