"""Writes over ``BidiWriteObject``: an appendable object, flushed, checked, finalized.

:func:`write` streams chunks into a new (appendable, on a zonal bucket)
object: each message at most 2 MiB with its CRC32C, a flush every
``flush_every`` bytes whose answer (the persisted size) frees what it covers,
so memory stays within two flushes' worth. The object is finalized only after
the server says it holds every byte (a flush and state lookup equal to the
size sent), with the whole object's CRC32C in the finalizing message (the
server refuses a mismatch), and the finalized resource is checked again (size
and CRC32C) before the write counts as done. google-cloud-storage 3.17's
appendable writer, broken mid-stream in an append after a flush, was seen to
finalize a short object; here a short or altered object is never reported
written: :class:`~torchbucket.errors.IntegrityError`.

A broken stream is resumed where the server says it stopped: the object is
reopened with ``AppendObjectSpec`` (generation and write handle), a state
lookup gives the persisted size, and the bytes from there on are sent again
from what is kept. Retries follow the store's :class:`RetryConfig` (backoff,
deadline) and hold one slot of the endpoint's adaptive limiter for the
stream's life; each stream opened (the first, and each reopened to resume)
spends one write from the job's request budget, when it is on, as a request
of the JSON API would.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from torchbucket.config import RetryConfig
from torchbucket.errors import IntegrityError, StorageError, ThrottledError, TransientError
from torchbucket.runtime import accounting, retry
from torchbucket.runtime.budget import Budget
from torchbucket.storage import crc32c
from torchbucket.storage.gcs._grpc_read import Meta, meta_of
from torchbucket.storage.gcs._grpc_wire import CHUNK_LIMIT, EOF, Channels, bucket_path, pb

__all__ = ["Writer", "write", "write_once"]


class Writer:
    """One object being written on a ``BidiWriteObject`` stream (see the module)."""

    def __init__(
        self,
        channels: Channels,
        bucket: str,
        key: str,
        metadata: Callable[[], Any],
        uri: str,
        *,
        appendable: bool = True,
        content_type: str | None = None,
        object_metadata: dict[str, str] | None = None,
        if_generation_match: int | None = None,
        flush_every: int = 16 << 20,
    ) -> None:
        self.channels = channels
        self.bucket = bucket_path(bucket)
        self.key = key
        self.metadata = metadata
        self.uri = uri
        self.appendable = appendable
        self.content_type = content_type
        self.object_metadata = object_metadata or {}
        self.if_generation_match = if_generation_match
        self.flush_every = max(flush_every, CHUNK_LIMIT)
        self.size = 0  # bytes handed to the stream
        self.crc = 0
        self.persisted = 0
        self.generation: int | None = None
        self.handle: bytes | None = None
        self._kept: deque[tuple[int, bytes]] = deque()  # (offset, bytes) not yet persisted
        self._call: Any = None
        self._since_flush = 0
        self._flush_pending = False
        self._sent = 0  # the stream's next write offset

    # ------------------------------------------------------------ the stream

    async def _open(self) -> None:
        m = pb()
        self._call = self.channels.method("BidiWriteObject")(metadata=await self.metadata())
        accounting.count("put")
        if self.generation is None:
            spec = m.BidiWriteObjectRequest().write_object_spec
            spec.resource.bucket = self.bucket
            spec.resource.name = self.key
            if self.content_type:
                spec.resource.content_type = self.content_type
            for k, v in self.object_metadata.items():
                spec.resource.metadata[k] = v
            if self.appendable:
                spec.appendable = True
            if self.if_generation_match is not None:
                spec.if_generation_match = self.if_generation_match
            first = m.BidiWriteObjectRequest(write_object_spec=spec)
        else:
            first = m.BidiWriteObjectRequest()
            aspec = first.append_object_spec
            aspec.bucket = self.bucket
            aspec.object_ = self.key
            aspec.generation = self.generation
            if self.handle:
                aspec.write_handle.handle = self.handle
        # Opening an appendable object (new, or again) is answered with its
        # resource and a write handle, as google-cloud-storage's writer expects.
        await self._call.write(first)
        resp = await self._read()
        self._learn(resp)
        if resp.HasField("resource"):
            self.generation = resp.resource.generation
        if self.generation is None:
            raise TransientError(
                "the write stream named no generation", operation="put", uri=self.uri
            )
        self._flush_pending = False
        self._sent = self.persisted
        await self._resend()

    async def _read(self) -> Any:
        resp = await self._call.read()
        if resp is EOF:
            raise TransientError("the write stream ended early", operation="put", uri=self.uri)
        return resp

    def _learn(self, resp: Any) -> None:
        if resp.HasField("write_handle"):
            self.handle = resp.write_handle.handle
        if resp.HasField("persisted_size"):
            self._persisted(resp.persisted_size)
        elif resp.HasField("resource"):
            self._persisted(resp.resource.size)

    def _persisted(self, size: int) -> None:
        if size > self.size:
            raise IntegrityError(
                f"the server holds {size} bytes, more than the {self.size} sent",
                operation="put",
                uri=self.uri,
            )
        self.persisted = size
        kept = self._kept
        while kept and kept[0][0] + len(kept[0][1]) <= size:
            kept.popleft()

    async def _resend(self) -> None:
        """Send again what the server does not hold (after a reopen)."""
        kept = self._kept
        if kept and kept[0][0] > self.persisted:
            raise IntegrityError(
                f"the server holds {self.persisted} bytes; the bytes from there were freed",
                operation="put",
                uri=self.uri,
            )
        for offset, data in list(kept):
            if offset + len(data) <= self.persisted:
                continue
            cut = max(0, self.persisted - offset)
            await self._send(offset + cut, data[cut:] if cut else data)

    async def _send(self, offset: int, data: bytes, **flags: bool) -> None:
        request = pb().BidiWriteObjectRequest(write_offset=offset, **flags)
        request.checksummed_data.content = data
        request.checksummed_data.crc32c = crc32c.extend(0, data)
        if offset != self._sent:
            raise TransientError(
                f"write at {offset}, the stream is at {self._sent}", operation="put", uri=self.uri
            )
        await self._call.write(request)
        self._sent = offset + len(data)

    # ------------------------------------------------------------ what callers do

    async def append(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` (any size), flushing every ``flush_every`` bytes."""
        view = memoryview(data).cast("B")
        for at in range(0, len(view), CHUNK_LIMIT):
            piece = bytes(view[at : at + CHUNK_LIMIT])
            offset = self.size
            self.size += len(piece)
            self.crc = crc32c.extend(self.crc, piece)
            self._kept.append((offset, piece))
            self._since_flush += len(piece)
            flush = self._since_flush >= self.flush_every
            await self._attempt(functools.partial(self._send_flush, offset, piece, flush))

    async def _send_flush(self, offset: int, piece: bytes, flush: bool) -> None:
        if offset < self._sent:
            return  # a resend after a reopen covered it
        if flush and self._flush_pending:
            # One flush in flight at a time: its answer frees what it covers.
            self._learn(await self._read())
            self._flush_pending = False
        if flush:
            await self._send(offset, piece, flush=True, state_lookup=True)
            self._flush_pending = True
            self._since_flush = 0
        else:
            await self._send(offset, piece)

    async def finish(self) -> Meta:
        """Check the server holds every byte, finalize, and check the object.

        Raises:
            IntegrityError: The server holds fewer or other bytes than sent.
        """
        await self._attempt(self._confirm)
        m = pb()
        request = m.BidiWriteObjectRequest(write_offset=self.size, finish_write=True)
        request.object_checksums.crc32c = self.crc
        await self._attempt(lambda: self._finalize(request))
        assert self._meta is not None
        meta = self._meta
        if meta.size != self.size or meta.crc32c != self.crc:
            got = "unknown" if meta.crc32c is None else crc32c.b64(meta.crc32c)
            raise IntegrityError(
                f"finalized {meta.size} bytes with CRC32C {got}; sent {self.size} "
                f"with {crc32c.b64(self.crc)}",
                operation="put",
                uri=self.uri,
            )
        return meta

    async def _confirm(self) -> None:
        if self._flush_pending:
            self._learn(await self._read())
            self._flush_pending = False
        await self._call.write(pb().BidiWriteObjectRequest(flush=True, state_lookup=True))
        self._learn(await self._read())
        if self.persisted != self.size:
            raise TransientError(
                f"the server holds {self.persisted} of {self.size} bytes after a flush",
                operation="put",
                uri=self.uri,
            )

    _meta: Meta | None = None

    async def _finalize(self, request: Any) -> None:
        await self._call.write(request)
        resp = await self._read()
        if not resp.HasField("resource"):
            raise TransientError("finalizing named no object", operation="put", uri=self.uri)
        self._meta = meta_of(resp.resource)
        await self._call.done_writing()

    def abort(self) -> None:
        """End the stream without finalizing (what was sent stays unfinalized)."""
        if self._call is not None:
            self._call.cancel()

    # ------------------------------------------------------------ retries

    config: RetryConfig = RetryConfig()
    limiter: retry.AdaptiveLimiter | None = None
    budget: Budget | None = None  # the job's request budget: one write per stream opened

    async def _attempt(self, step: Callable[[], Any]) -> None:
        """Run ``step`` on the stream; on a break, reopen, resend and run it again."""
        from torchbucket.storage.gcs._grpc_wire import error_of_call

        deadline = time.monotonic() + self.config.deadline
        attempt = 0
        while True:
            try:
                if self._call is None:
                    if self.budget is not None:
                        await self.budget.turn(1)
                    await self._open()
                await step()
                return
            except (StorageError, asyncio.CancelledError):
                raise
            except Exception as exc:  # grpc.aio.AioRpcError, or a write after the end
                error = await error_of_call(self._call, exc, operation="put", uri=self.uri)
                if self._call is not None:
                    self._call.cancel()
                self._call = None
                if isinstance(error, ThrottledError):
                    accounting.throttle()
                    if self.limiter is not None:
                        self.limiter.on_throttle()
                    if self.budget is not None:
                        self.budget.throttled(1)
                if not retry.is_retryable(error, idempotent=True):
                    raise error from exc
                if self.generation is None and self.if_generation_match is None:
                    # Lost before the object existed: start it again from nothing.
                    self.persisted = 0
                delay = retry.backoff_delay(attempt, self.config)
                attempt += 1
                cap = self.config.max_attempts
                if time.monotonic() + delay >= deadline or (cap is not None and attempt >= cap):
                    raise error from exc
                accounting.retried(delay, throttled=isinstance(error, ThrottledError))
                await asyncio.sleep(delay)


async def write(writer: Writer, chunks: AsyncIterator[bytes | bytearray | memoryview]) -> Meta:
    """Stream ``chunks`` through ``writer`` and finalize (see :class:`Writer`).

    The stream is cancelled, unfinalized, on any failure (the caller's iterator
    raising included).
    """
    limiter = writer.limiter
    if limiter is not None:
        await limiter.acquire()
    try:
        async for chunk in chunks:
            if len(chunk):
                await writer.append(chunk)
        meta = await writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        if limiter is not None:
            limiter.release()
    if limiter is not None:
        limiter.on_success()
    return meta


async def write_once(writer: Writer, data: bytes) -> Meta:
    """Create, fill and finalize an object in one message (at most 2 MiB).

    One request: the name never holds a partial or unfinalized object, and
    what the server finalized is checked (size and CRC32C) as :meth:`Writer.finish`
    checks it. Not retried here (the caller's :func:`torchbucket.retry.call` is).

    Raises:
        IntegrityError: The object finalized is not what was sent.
        StorageError: The mapped error of the RPC.
    """
    from torchbucket.storage.gcs._grpc_wire import error_of_call

    m = pb()
    request = m.BidiWriteObjectRequest(write_offset=0, finish_write=True)
    spec = request.write_object_spec
    spec.resource.bucket = writer.bucket
    spec.resource.name = writer.key
    if writer.content_type:
        spec.resource.content_type = writer.content_type
    for k, v in writer.object_metadata.items():
        spec.resource.metadata[k] = v
    if writer.appendable:
        spec.appendable = True
    if writer.if_generation_match is not None:
        spec.if_generation_match = writer.if_generation_match
    crc = crc32c.extend(0, data)
    if data:
        request.checksummed_data.content = data
        request.checksummed_data.crc32c = crc
    request.object_checksums.crc32c = crc
    accounting.count("put", len(data))
    call = writer.channels.method("BidiWriteObject")(metadata=await writer.metadata())
    try:
        await call.write(request)
        await call.done_writing()
        # The opening answer (the new object, empty) may come before the
        # finalized one: the last resource is the object.
        resp, last = None, await call.read()
        while last is not EOF:
            if last.HasField("resource"):
                resp = last
            last = await call.read()
    except asyncio.CancelledError:
        call.cancel()
        raise
    except Exception as exc:
        error = await error_of_call(call, exc, operation="put", uri=writer.uri)
        call.cancel()
        raise error from exc
    if resp is None:
        raise TransientError("finalizing named no object", operation="put", uri=writer.uri)
    meta = meta_of(resp.resource)
    if meta.size != len(data) or meta.crc32c not in (None, crc):
        raise IntegrityError(
            f"finalized {meta.size} bytes; sent {len(data)} with CRC32C {crc32c.b64(crc)}",
            operation="put",
            uri=writer.uri,
        )
    return meta
