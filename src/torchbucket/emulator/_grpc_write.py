"""gRPC writes: ``BidiWriteObject`` (appendable objects) and ``WriteObject``.

What the emulator relies on (google.storage.v2's storage.proto, as shipped in
google-cloud-storage 3.x's ``_storage_v2``, and its ``AsyncAppendableObjectWriter``):

- The first message carries ``write_object_spec`` (a new object; with
  ``appendable`` an appendable one, which exists from then on, size 0) or
  ``append_object_spec`` (an existing unfinalized appendable object, by
  generation: a reopen after a broken stream, or a takeover by another
  writer). For an appendable object the service answers at once with the
  ``resource`` (generation, persisted size) and a ``write_handle``.
- Each data message's ``write_offset`` must equal the bytes the stream has so
  far (persisted plus sent); a chunk whose ``crc32c`` does not match fails the
  stream (INVALID_ARGUMENT).
- ``flush`` persists what was sent; ``state_lookup`` (and the client's
  half-close) gets a response with ``persisted_size``; ``finish_write``
  finalizes (checking ``object_checksums``) and gets the ``resource``, with
  ``finalize_time``. Other messages get no response.
- The emulator persists only at a flush, a finish or a clean half-close: bytes
  sent after the last of them are lost when a stream breaks (the service
  "periodically" persists on its own; a client may count on nothing more than
  the persisted size it was told, and the client resumes from it).
- A takeover (``append_object_spec`` on a stream other than the owner's) makes
  the new stream the owner; the old one's next flush, state lookup or finish
  fails with FAILED_PRECONDITION, which the client does not retry (the data
  it sent meanwhile is dropped).
- Appendable objects exist only in zonal buckets (Rapid); elsewhere
  ``appendable`` is refused (INVALID_ARGUMENT).

Faults (rules on ``put``, checked once per stream at its start): a status
kind fails the open; ``reset`` breaks the stream (UNAVAILABLE) at its first
flush or finish, before anything of it is persisted; ``truncate`` breaks it
mid-append after a flush: at the first flush or finish that follows one
the stream persisted (at its finish if it never flushed), so what was sent
since that flush is lost and the client must resume from the persisted size;
``corrupt_request`` flips a byte of the first data chunk (its CRC32C then
fails it); ``stall_answer`` persists a finish, holds the answer, then breaks.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import google_crc32c
import grpc

from torchbucket.emulator._grpc_common import (
    RpcError,
    bucket_of,
    make_handle,
    object_proto,
    pb,
    preconditions,
    read_handle_ok,
)
from torchbucket.emulator._model_store import Preconditions
from torchbucket.emulator._zonal import AppendableObject, check_zonal, create_appendable

if TYPE_CHECKING:
    from torchbucket.emulator._faults import FaultRule
    from torchbucket.emulator._grpc_server import GrpcFront, Tally
    from torchbucket.emulator._model_object import ModelObject

__all__ = ["WriteApi"]

_tokens = itertools.count(1)
_BAD = grpc.StatusCode.INVALID_ARGUMENT


class _Upload:
    """One write stream's state: the object, what is persisted, what is pending."""

    def __init__(self, g: GrpcFront, tally: Tally, rule: FaultRule | None) -> None:
        self.g = g
        self.tally = tally
        self.kind = rule.kind if rule is not None else None
        self.stall_seconds = rule.stall_seconds if rule is not None else 0.0
        self.token = next(_tokens)
        self.obj: AppendableObject | None = None  # appendable uploads
        self.bucket = ""
        self.name = ""
        self.meta: dict[str, Any] = {}
        self.pre = Preconditions()
        self.pending: list[bytes] = []
        self.persisted = 0  # bytes persisted
        self.received = 0  # bytes persisted + pending
        self.crc = 0  # CRC32C of persisted + pending
        self.persisted_crc = 0
        self.finished = False
        self.flushed = 0  # flushes this stream persisted

    # -- opening --------------------------------------------------------------

    def open_new(self, spec: Any) -> Any:
        """A ``write_object_spec``: an appendable object now, or a plain upload later."""
        resource = spec.resource
        self.bucket, self.name = bucket_of(resource.bucket), resource.name
        if not self.name:
            raise RpcError(_BAD, "write_object_spec.resource.name is required")
        self.meta = {
            "content_type": resource.content_type or None,
            "metadata": dict(resource.metadata) or None,
        }
        self.pre = preconditions(spec)
        store = self.g.store
        if not (spec.HasField("appendable") and spec.appendable):
            store.bucket(self.bucket)  # 404 now rather than at the end
            return None
        check_zonal(store, self.bucket)
        self.obj = create_appendable(store, self.bucket, self.name, pre=self.pre, **self.meta)
        self._own()
        return self._opened()

    def open_append(self, spec: Any) -> Any:
        """An ``append_object_spec``: reopen (or take over) an unfinalized appendable object."""
        self.bucket, self.name = bucket_of(spec.bucket), spec.object_
        obj = self.g.store.get(self.bucket, self.name, spec.generation or None)
        if spec.HasField("write_handle"):
            named = read_handle_ok(b"wh", spec.write_handle.handle, self.bucket, self.name)
            if named is None or named != obj.generation:
                raise RpcError(_BAD, "write_handle names another object or generation")
        else:  # metageneration preconditions count only without a handle (storage.proto)
            pre = preconditions(spec)
            pre.check(obj, "object")
        if not isinstance(obj, AppendableObject):
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION, f"{self.bucket}/{self.name} is not appendable"
            )
        if obj.finalized:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION, f"{self.bucket}/{self.name} is finalized"
            )
        self.obj = obj
        self.persisted = self.received = obj.size
        self.crc = self.persisted_crc = obj.crc_value
        self._own()
        return self._opened()

    @property
    def zonal(self) -> bool:
        """Whether the object's bucket is a zonal one."""
        return bool(self.g.store.bucket(self.bucket).zonal)

    def _own(self) -> None:
        assert self.obj is not None
        self.g.owners[(self.bucket, self.name, self.obj.generation)] = self.token

    def _opened(self) -> Any:
        assert self.obj is not None
        out = pb.BidiWriteObjectResponse()
        out.resource.CopyFrom(object_proto(self.obj, zonal=True))
        out.write_handle.handle = make_handle(b"wh", self.obj)
        return out

    # -- messages -------------------------------------------------------------

    def check_live(self) -> None:
        obj = self.obj
        if obj is None:
            return
        owner = self.g.owners.get((self.bucket, self.name, obj.generation))
        if owner != self.token:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.bucket}/{self.name} was taken over by another writer",
            )
        current = self.g.store.bucket(self.bucket).objects.get(self.name)
        if current is not obj:
            raise RpcError(
                grpc.StatusCode.NOT_FOUND,
                f"{self.bucket}/{self.name} generation {obj.generation} no longer exists",
            )

    def take_data(self, msg: Any) -> None:
        """Buffer one message's data, checking its offset and CRC32C."""
        if not msg.HasField("checksummed_data"):
            return
        data = msg.checksummed_data
        content = bytes(data.content)
        if msg.write_offset != self.received:
            raise RpcError(
                _BAD, f"write_offset {msg.write_offset} is not the object's size {self.received}"
            )
        if self.kind == "corrupt_request" and content:
            flipped = bytearray(content)
            flipped[len(flipped) // 2] ^= 0xFF
            content = bytes(flipped)
            self.kind = None
        if data.HasField("crc32c") and google_crc32c.value(content) != data.crc32c:
            raise RpcError(
                _BAD, f"the CRC32C of the data at offset {msg.write_offset} does not match"
            )
        self.pending.append(content)
        self.received += len(content)
        self.crc = int(google_crc32c.extend(self.crc, content))
        self.tally.received(len(content))

    async def _break_if_faulted(self, *, finishing: bool = False) -> None:
        if self.kind == "reset" or (self.kind == "truncate" and (self.flushed or finishing)):
            self.kind = None
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "Stream broken mid-write (injected fault).")

    async def flush(self, *, commit: bool = True) -> None:
        """Persist what was sent (a round trip to durable storage).

        With ``commit=False`` only the round trip and the checks; :meth:`commit`
        then persists, with nothing awaited in between.
        """
        await self._break_if_faulted()
        await self.g.first_byte("put")
        self.check_live()
        if commit:
            self.commit()
            self.flushed += 1

    def commit(self) -> None:
        """Persist the pending bytes (no await: atomic on the server's loop)."""
        self.check_live()
        if self.obj is not None:
            self.obj.append(self.pending, self.crc)
            self.pending = []
        self.persisted = self.received
        self.persisted_crc = self.crc

    def persisted_response(self, size: int | None = None, crc: int | None = None) -> Any:
        """A response with the persisted size (or ``size``, about to be persisted)."""
        out = pb.BidiWriteObjectResponse()
        out.persisted_size = self.persisted if size is None else size
        out.persisted_data_checksums.crc32c = self.persisted_crc if crc is None else crc
        if self.obj is not None:
            out.write_handle.handle = make_handle(b"wh", self.obj)
        return out

    async def finish(self, msg: Any) -> ModelObject:
        """``finish_write``: check the object's checksums, then finalize it."""
        sums = msg.object_checksums if msg.HasField("object_checksums") else None
        if sums is not None and sums.HasField("crc32c") and sums.crc32c != self.crc:
            raise RpcError(_BAD, "the object's CRC32C does not match the data received")
        await self._break_if_faulted(finishing=True)
        await self.g.first_byte("put")
        self.check_live()
        if self.obj is not None:
            self.obj.append(self.pending, self.crc)
            self.obj.finalize()
            obj: ModelObject = self.obj
        else:
            data = b"".join(self.pending)
            if sums is not None and sums.md5_hash:
                import hashlib

                if hashlib.md5(data).digest() != sums.md5_hash:
                    raise RpcError(_BAD, "the object's MD5 does not match the data received")
            obj = self.g.store.put(self.bucket, self.name, data, pre=self.pre, **self.meta)
        self.pending = []
        self.persisted = self.received
        self.finished = True
        if self.kind == "stall_answer":
            await asyncio.sleep(self.stall_seconds)
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "Answer lost (injected fault).")
        return obj


class WriteApi:
    """The write RPCs of one :class:`GrpcFront`."""

    def __init__(self, front: GrpcFront) -> None:
        self.g = front

    async def _open(
        self, first: Any, context: Any, tally: Tally, bidi: bool
    ) -> tuple[_Upload, Any]:
        which = first.WhichOneof("first_message")
        if which == "write_object_spec":
            target = first.write_object_spec.resource
            bucket, name = bucket_of(target.bucket), target.name
        elif which == "append_object_spec" and bidi:
            bucket, name = (
                bucket_of(first.append_object_spec.bucket),
                first.append_object_spec.object_,
            )
        elif which == "upload_id":
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, "resumable gRPC uploads are not served")
        else:
            raise RpcError(_BAD, "the first message needs write_object_spec or append_object_spec")
        rule = await self.g.admit(context, tally, "put", bucket, name)
        tally.op = "put"
        upload = _Upload(self.g, tally, rule)
        await self.g.first_byte("put")
        if which == "write_object_spec":
            if first.write_object_spec.HasField("appendable") and not bidi:
                raise RpcError(_BAD, "appendable objects are written with BidiWriteObject")
            opened = upload.open_new(first.write_object_spec)
        else:
            opened = upload.open_append(first.append_object_spec)
        return upload, opened

    async def bidi_write(self, requests: Any, context: Any, tally: Tally) -> AsyncIterator[Any]:
        """``BidiWriteObject``: appendable objects, flushes, state lookups, finalize."""
        it = requests.__aiter__()
        try:
            msg = await it.__anext__()
        except StopAsyncIteration:
            return
        upload, opened = await self._open(msg, context, tally, bidi=True)
        if opened is not None:
            yield opened
        while True:
            if upload.finished:
                raise RpcError(_BAD, "a message after finish_write")
            # A displaced writer learns of the takeover at its next flush, state
            # lookup or finish (data alone gets no answer: it is dropped), so the
            # error comes on a call the client waits on.
            upload.take_data(msg)
            if msg.finish_write:
                obj = await upload.finish(msg)
                out = pb.BidiWriteObjectResponse()
                out.resource.CopyFrom(object_proto(obj, zonal=upload.zonal))
                yield out
            elif msg.flush:
                await upload.flush()
                if msg.state_lookup:
                    yield upload.persisted_response()
            elif msg.state_lookup:
                upload.check_live()
                yield upload.persisted_response()
            try:
                msg = await it.__anext__()
            except StopAsyncIteration:
                break
        if not upload.finished:
            if upload.obj is None:
                raise RpcError(_BAD, "the stream ended without finish_write")
            # A clean half-close persists what was sent. A broken stream ends
            # the request iterator just the same, so the answer goes first and
            # the bytes are persisted only once it is written: on a cancelled
            # call the write fails and this generator is never resumed.
            await upload.flush(commit=False)
            yield upload.persisted_response(upload.received, upload.crc)
            upload.commit()

    async def write_object(self, requests: Any, context: Any, tally: Tally) -> Any:
        """``WriteObject``: one object from a client stream ending in ``finish_write``."""
        it = requests.__aiter__()
        try:
            msg = await it.__anext__()
        except StopAsyncIteration:
            raise RpcError(_BAD, "an empty WriteObject stream") from None
        upload, _ = await self._open(msg, context, tally, bidi=False)
        while True:
            if upload.finished:
                raise RpcError(_BAD, "a message after finish_write")
            upload.take_data(msg)
            if msg.finish_write:
                obj = await upload.finish(msg)
                out = pb.WriteObjectResponse()
                out.resource.CopyFrom(object_proto(obj, zonal=upload.zonal))
                return out
            try:
                msg = await it.__anext__()
            except StopAsyncIteration:
                raise RpcError(_BAD, "the stream ended without finish_write") from None
