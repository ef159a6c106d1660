"""An in-process fake of google.storage.v2's object RPCs, for the gRPC path's unit tests.

A ``grpc.aio`` server on its own thread and loop, over a dict of objects, with
what the client must cope with: appendable objects that are live (and replace
the previous object of their name) from their first message, finalize with a
whole-object CRC32C, per-chunk CRC32C both ways, read handles, and faults (a
read stream broken after some bytes, a chunk corrupted, a write stream broken
after a flush). It is not the emulator (issue 42 point 5): just enough of the
contract to test the client against until that serves gRPC.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.cloud import _storage_v2 as v2
from google.protobuf import empty_pb2

from torchbucket.storage import crc32c

ReadReq = v2.BidiReadObjectRequest.pb()
ReadResp = v2.BidiReadObjectResponse.pb()
WriteReq = v2.BidiWriteObjectRequest.pb()
WriteResp = v2.BidiWriteObjectResponse.pb()
ObjectPb = v2.Object.pb()
GetReq = v2.GetObjectRequest.pb()
DelReq = v2.DeleteObjectRequest.pb()
CHUNK = 1 << 20


@dataclass
class Obj:
    data: bytearray
    generation: int
    finalized: bool = False
    content_type: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class Faults:
    #: Break the next read streams after this many bytes sent (one per entry).
    break_reads_after: list[int] = field(default_factory=list)
    #: Corrupt the next N read chunks (content changed, checksum kept).
    corrupt_reads: int = 0
    #: Break the next write streams after this many bytes persisted (one per entry).
    break_writes_after: list[int] = field(default_factory=list)
    #: Corrupt the stored bytes of the next finalize (the object's CRC then differs).
    short_finalize: int = 0
    #: Finalize without checking the object's CRC32C (a server that finalizes
    #: what it holds, as google-cloud-storage 3.17's writer got one to).
    lax_finalize: bool = False


class FakeStorage:
    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.faults = Faults()
        self.calls: dict[str, int] = {}
        self._gen = 1000

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _next_gen(self) -> int:
        self._gen += 1
        return self._gen

    def resource(self, name: str, obj: Obj) -> Any:
        r = ObjectPb(
            name=name,
            bucket="projects/_/buckets/b",
            generation=obj.generation,
            size=len(obj.data),
            content_type=obj.content_type,
        )
        r.checksums.crc32c = crc32c.extend(0, bytes(obj.data))
        for k, val in obj.metadata.items():
            r.metadata[k] = val
        if obj.finalized:
            r.finalize_time.seconds = 1
        return r

    def _opened(self, name: str, obj: Obj) -> Any:
        resp = WriteResp(resource=self.resource(name, obj))
        resp.write_handle.handle = b"w-" + name.encode()
        return resp

    async def get_object(self, req: Any, ctx: grpc.aio.ServicerContext) -> Any:
        self._count("GetObject")
        obj = self.objects.get(req.object_)
        if obj is None or (req.generation and obj.generation != req.generation):
            await ctx.abort(grpc.StatusCode.NOT_FOUND, f"no object {req.object_}")
        return self.resource(req.object_, obj)

    async def delete_object(self, req: Any, ctx: grpc.aio.ServicerContext) -> Any:
        self._count("DeleteObject")
        obj = self.objects.get(req.object_)
        if obj is None or (req.generation and obj.generation != req.generation):
            await ctx.abort(grpc.StatusCode.NOT_FOUND, f"no object {req.object_}")
        del self.objects[req.object_]
        return empty_pb2.Empty()

    async def bidi_read(self, requests: Any, ctx: grpc.aio.ServicerContext) -> Any:
        self._count("BidiReadObject")
        budget = self.faults.break_reads_after.pop(0) if self.faults.break_reads_after else None
        sent = 0
        first = True
        async for req in requests:
            if first:
                spec = req.read_object_spec
                obj = self.objects.get(spec.object_)
                if obj is None or (spec.generation and obj.generation != spec.generation):
                    await ctx.abort(grpc.StatusCode.NOT_FOUND, f"no object {spec.object_}")
                resp = ReadResp(metadata=self.resource(spec.object_, obj))
                resp.read_handle.handle = b"h-" + spec.object_.encode()
                if not req.read_ranges:
                    yield resp
                first = False
            else:
                resp = None
            for rng in req.read_ranges:
                size = len(obj.data)
                if rng.read_offset > size:
                    await ctx.abort(grpc.StatusCode.OUT_OF_RANGE, "offset past the end")
                end = size if rng.read_length == 0 else min(size, rng.read_offset + rng.read_length)
                pos = rng.read_offset
                while True:
                    piece = bytes(obj.data[pos : min(end, pos + CHUNK)])
                    if budget is not None and sent + len(piece) > budget:
                        await ctx.abort(grpc.StatusCode.UNAVAILABLE, "stream broken (fault)")
                    sent += len(piece)
                    crc = crc32c.extend(0, piece)
                    if self.faults.corrupt_reads and piece:
                        self.faults.corrupt_reads -= 1
                        piece = bytes([piece[0] ^ 1]) + piece[1:]
                    out = resp if resp is not None else ReadResp()
                    resp = None
                    d = out.object_data_ranges.add()
                    d.checksummed_data.content = piece
                    d.checksummed_data.crc32c = crc
                    d.read_range.read_offset = pos
                    d.read_range.read_length = len(piece)
                    d.read_range.read_id = rng.read_id
                    pos += len(piece)
                    d.range_end = pos >= end
                    yield out
                    if pos >= end:
                        break

    async def bidi_write(self, requests: Any, ctx: grpc.aio.ServicerContext) -> Any:
        self._count("BidiWriteObject")
        budget = self.faults.break_writes_after.pop(0) if self.faults.break_writes_after else None
        name = None
        obj: Obj | None = None
        async for req in requests:
            if req.HasField("write_object_spec"):
                spec = req.write_object_spec
                name = spec.resource.name
                cur = self.objects.get(name)
                ifg = spec.if_generation_match if spec.HasField("if_generation_match") else None
                if ifg is not None and (cur.generation if cur else 0) != ifg:
                    await ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "generation mismatch")
                obj = Obj(
                    bytearray(),
                    self._next_gen(),
                    content_type=spec.resource.content_type,
                    metadata=dict(spec.resource.metadata),
                )
                # An appendable object is live from its first message.
                self.objects[name] = obj
                yield self._opened(name, obj)
            elif req.HasField("append_object_spec"):
                spec = req.append_object_spec
                name = spec.object_
                obj = self.objects.get(name)
                if obj is None or obj.generation != spec.generation:
                    await ctx.abort(grpc.StatusCode.NOT_FOUND, "no such appendable object")
                if obj.finalized:
                    await ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "finalized")
                yield self._opened(name, obj)
            assert obj is not None and name is not None
            if req.HasField("checksummed_data"):
                data = req.checksummed_data.content
                if req.write_offset != len(obj.data):
                    await ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad write_offset")
                if req.checksummed_data.HasField("crc32c") and (
                    crc32c.extend(0, data) != req.checksummed_data.crc32c
                ):
                    await ctx.abort(grpc.StatusCode.DATA_LOSS, "chunk CRC32C mismatch")
                if budget is not None and len(obj.data) + len(data) > budget:
                    obj.data += data[: max(0, budget - len(obj.data))]
                    await ctx.abort(grpc.StatusCode.UNAVAILABLE, "stream broken (fault)")
                obj.data += data
            if req.finish_write:
                if self.faults.short_finalize:
                    self.faults.short_finalize -= 1
                    del obj.data[-1:]
                want = req.object_checksums.crc32c if req.HasField("object_checksums") else None
                if (
                    want is not None
                    and not self.faults.lax_finalize
                    and req.object_checksums.HasField("crc32c")
                    and crc32c.extend(0, bytes(obj.data)) != want
                ):
                    await ctx.abort(grpc.StatusCode.DATA_LOSS, "object CRC32C mismatch")
                obj.finalized = True
                yield WriteResp(resource=self.resource(name, obj))
            elif req.flush or req.state_lookup:
                resp = WriteResp(persisted_size=len(obj.data))
                resp.write_handle.handle = b"w-" + name.encode()
                yield resp


class FakeServer:
    """The fake on 127.0.0.1, on a thread of its own; ``target`` is ``host:port``."""

    def __init__(self) -> None:
        self.storage = FakeStorage()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(10)
        self.target = f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._started.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        s = self.storage
        handlers = {
            "BidiReadObject": grpc.stream_stream_rpc_method_handler(
                s.bidi_read, ReadReq.FromString, ReadResp.SerializeToString
            ),
            "BidiWriteObject": grpc.stream_stream_rpc_method_handler(
                s.bidi_write, WriteReq.FromString, WriteResp.SerializeToString
            ),
            "GetObject": grpc.unary_unary_rpc_method_handler(
                s.get_object, GetReq.FromString, ObjectPb.SerializeToString
            ),
            "DeleteObject": grpc.unary_unary_rpc_method_handler(
                s.delete_object, DelReq.FromString, empty_pb2.Empty.SerializeToString
            ),
        }
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.storage.v2.Storage", handlers),)
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()

    def put(self, name: str, data: bytes, **metadata: str) -> Obj:
        obj = Obj(bytearray(data), self.storage._next_gen(), True, metadata=dict(metadata))
        self.storage.objects[name] = obj
        return obj

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
