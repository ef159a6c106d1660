"""Writes over ``BidiWriteObject``: an appendable object, flushed, checked, finalized.

:func:`write` streams chunks into a new (appendable, on a zonal bucket)
object: each message at most 2 MiB with its CRC32C, a flush every
``flush_every`` bytes whose answer (the persisted size) frees what it covers,
so memory stays within two flushes' worth. The finalizing message carries the
offset of the end and the whole object's CRC32C (combined from the messages'
own), so the server refuses to finalize other bytes than were sent, and the
finalized resource is checked again (size and CRC32C) before the write counts
as done: no flush round trip before the finish is needed for that (one fewer
per save). google-cloud-storage 3.17's
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
from torchbucket.errors import (
    DeadlineExceededError,
    IntegrityError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.runtime import accounting, retry
from torchbucket.runtime.budget import Budget
from torchbucket.storage import crc32c
from torchbucket.storage.gcs._grpc_data import Meta, data_message, finish_message, meta_of
from torchbucket.storage.gcs._grpc_wire import CHUNK_LIMIT, EOF, Channels, bucket_path, pb

__all__ = ["FLUSH_CHUNKS", "Writer", "write", "write_once"]

#: A store's gRPC writes flush every this many ``upload_chunk_size`` (64 MiB by
#: default). A flush is a round trip to durable storage, during which the
#: emulator (write latency 40 ms) reads nothing more of the stream: a 128 MiB
#: checkpoint save took 0.93-1.04 s flushing every 16 MiB (google-cloud-storage's
#: interval), 0.55-0.67 s every 64 MiB. Memory kept for a resend is at most
#: two flushes' worth.
FLUSH_CHUNKS = 4


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
        # (offset, content, its CRC32C) not yet persisted: views of the messages sent.
        self._kept: deque[tuple[int, memoryview, int]] = deque()
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
        for offset, data, crc in list(kept):
            if offset + len(data) <= self.persisted:
                continue
            cut = max(0, self.persisted - offset)
            piece = data[cut:] if cut else data
            message, _ = data_message(offset + cut, piece, crc32c.extend(0, piece) if cut else crc)
            await self._send(offset + cut, message, len(piece))

    async def _send(self, offset: int, message: bytes, count: int) -> None:
        """Write one serialized data ``message`` of ``count`` bytes at ``offset``."""
        if offset != self._sent:
            raise TransientError(
                f"write at {offset}, the stream is at {self._sent}", operation="put", uri=self.uri
            )
        await self._call.write(message)
        self._sent = offset + count

    # ------------------------------------------------------------ what callers do

    async def append(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` (any size), flushing every ``flush_every`` bytes.

        Each message of at most 2 MiB is checksummed once (its CRC32C, which
        the object's is combined from) and copied once, into the serialized
        message (:mod:`._grpc_data`), which is also what is kept for a resend:
        ``data`` is not referenced once this returns.
        """
        view = memoryview(data).cast("B")
        for at in range(0, len(view), CHUNK_LIMIT):
            piece = view[at : at + CHUNK_LIMIT]
            count, offset = len(piece), self.size
            crc = crc32c.extend(0, piece)
            self.size += count
            self.crc = crc32c.combine(self.crc, crc, count)
            self._since_flush += count
            flush = self._since_flush >= self.flush_every
            message, start = data_message(offset, piece, crc, flush=flush, state_lookup=flush)
            self._kept.append((offset, memoryview(message)[start : start + count], crc))
            await self._attempt(functools.partial(self._send_flush, offset, message, count, flush))

    async def _send_flush(self, offset: int, message: bytes, count: int, flush: bool) -> None:
        if offset < self._sent:
            return  # a resend after a reopen covered it
        if flush and self._flush_pending:
            # One flush in flight at a time: its answer frees what it covers.
            self._learn(await self._read())
            self._flush_pending = False
        await self._send(offset, message, count)
        if flush:
            self._flush_pending = True
            self._since_flush = 0

    async def finish(self) -> Meta:
        """Check the server holds every byte, finalize, and check the object.

        Raises:
            IntegrityError: The server holds fewer or other bytes than sent.
        """
        # No flush first: the server refuses a finish whose object CRC32C is
        # not that of the bytes it holds, and the object it finalized is
        # checked here, size and CRC32C, before anyone points at it.
        await self._attempt(self._finalize)
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

    _meta: Meta | None = None

    async def _finalize(self) -> None:
        if self._flush_pending:
            self._learn(await self._read())
            self._flush_pending = False
        await self._call.write(finish_message(self.size, self.crc))
        resp = await self._read()
        while not resp.HasField("resource") and resp.HasField("persisted_size"):
            self._learn(resp)  # a flush's answer the server sent late
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
                    raise _gave_up(error, attempt, self.config) from exc
                accounting.retried(delay, throttled=isinstance(error, ThrottledError))
                await asyncio.sleep(delay)


def _gave_up(error: StorageError, attempts: int, config: RetryConfig) -> StorageError:
    """What a write stream that failed until its deadline raises: as retry.call does,
    a :class:`DeadlineExceededError` naming the last error (an integrity error stays one)."""
    if isinstance(error, IntegrityError):
        return error
    return DeadlineExceededError(
        f"still failing at the {config.deadline:g} s retry deadline ({attempts} attempts); "
        f"last error: {type(error).__name__}: {error.message}",
        operation=error.operation,
        uri=error.uri,
        status=error.status,
    )


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
