"""Reads over ``BidiReadObject``: many ranges of one object on one stream.

A :class:`ReadStreams` keeps, per object generation, the bidi read stream that
its reads in flight share: the parallel ranges of a checkpoint load go out as
``ReadRange`` messages on one stream (one round trip to open it, none per
range), and a dataset's small objects each get a stream of their own, all of
them multiplexed on the channel's HTTP/2 connection. A stream ends as soon as
it has no read left; the next read opens another (one message: the object and
its first range), with the read handle of the last one (GCS skips the lookup).

Every chunk is checked against the CRC32C the server sent with it, and a read
of a whole object against the object's CRC32C (from the metadata on the
stream's first message), combined from the chunks' checksums. Each read is one
:func:`torchbucket.retry.call` (limiter, job budget, backoff, deadline); a
corrupt chunk fails the attempt (an ``IntegrityError``) and is read again, up
to ``retry.CORRUPT_ANSWERS`` corrupt answers a read, the rule of every path
(bytes corrupt at rest fail in a few reads, not at the deadline); a
broken stream fails the attempt of every read on it, and each retry asks only
for what it has not received yet (from the last byte received), on a new
stream opened with the old one's read handle (or the handle and routing token
of a redirect, ``BidiReadObjectRedirectedError``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchbucket.errors import IntegrityError, StorageError, TransientError
from torchbucket.runtime import accounting
from torchbucket.runtime.watchdog import watchdog
from torchbucket.storage import crc32c
from torchbucket.storage.gcs._grpc_data import Meta, Range, RangeData, meta_of
from torchbucket.storage.gcs._grpc_wire import EOF, Channels, bucket_path, error_for_rpc, pb

__all__ = ["RangeRead", "ReadStreams"]

logger = logging.getLogger(__name__)

#: Ranges one stream carries at once before another stream is opened beside it: a
#: checkpoint load's ranges go out on a few streams, not all on one.
MAX_RANGES_PER_STREAM = 16
#: Read handles kept per store (the latest objects read).
_HANDLES_KEPT = 1024


@dataclass(eq=False, slots=True)
class RangeRead:
    """One range being read: ``[pos, end)`` is still to come (``end`` None: to the end).

    ``sink(offset, data)`` receives each checked chunk at its object offset:
    ``bytes``, or a read-only view valid only during the call (copy what is kept).
    """

    start: int
    end: int | None
    sink: Callable[[int, bytes | memoryview], None]
    pos: int = -1
    crc: int = 0
    whole_crc: bool = False
    done: asyncio.Future[Meta] | None = None
    read_id: int = 0
    #: Combine ``crc`` over every chunk (not only a whole-object read), from
    #: the chunks' own checksums; ``crc_known`` false once one came without.
    crc_all: bool = False
    crc_known: bool = True
    meta: Meta | None = field(default=None)

    def __post_init__(self) -> None:
        if self.pos < 0:
            self.pos = self.start
        self.whole_crc = self.start == 0 and self.end is None

    @property
    def remaining(self) -> int:
        """Bytes still to read, 0 for "to the end of the object"."""
        return 0 if self.end is None else self.end - self.pos


_ids = itertools.count(1)


def _range_of(data: Any) -> Range:
    """An ``ObjectRangeData`` message as :class:`RangeData` holds each range."""
    cd = data.checksummed_data
    crc = cd.crc32c if cd.HasField("crc32c") else None
    return data.read_range.read_id, data.read_range.read_offset, cd.content, crc, data.range_end


class _Stream:
    """One ``BidiReadObject`` call and the reads on it."""

    def __init__(
        self,
        owner: ReadStreams,
        key: str,
        generation: int | None,
        on_meta: Callable[[str, Meta], None] | None,
    ) -> None:
        self.owner = owner
        self.on_meta = on_meta
        self.key = key
        self.generation = generation
        self.reads: dict[int, RangeRead] = {}
        self.closed = False
        self.call: Any = None
        #: Set once :meth:`open` ended (the call made and its first message
        #: sent, or the open failed): a read added meanwhile waits for it.
        self.opening: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.meta: Meta | None = None
        self.task: asyncio.Task[None] | None = None

    def _range(self, read: RangeRead) -> Any:
        read.read_id = next(_ids)
        length = read.remaining
        return pb().ReadRange(read_offset=read.pos, read_length=length, read_id=read.read_id)

    async def open(self, read: RangeRead) -> None:
        opening = self.opening = asyncio.Event()  # before any await: one open per stream
        try:
            await self._open(read)
        except BaseException:
            self.closed = True  # reads added meanwhile fail their attempt, and retry
            if self.call is not None:
                self.call.cancel()  # cancelled while sending its first message
            raise
        finally:
            opening.set()

    async def _open(self, read: RangeRead) -> None:
        m = pb()
        owner = self.owner
        spec = m.BidiReadObjectSpec(bucket=owner.bucket_name, object_=self.key)
        if self.generation is not None:
            spec.generation = self.generation
            # Only a read of a known generation reuses a handle (a handle is
            # of one generation); the stream then may send no metadata.
            known = owner.handles.get((self.key, self.generation))
            if known is not None:
                handle, token, self.meta = known
                if handle:
                    spec.read_handle.handle = handle
                if token:
                    spec.routing_token = token
        request = m.BidiReadObjectRequest(read_object_spec=spec)
        request.read_ranges.append(self._range(read))
        self.reads[read.read_id] = read
        metadata = await owner.metadata()
        self.call = owner.channels.method("BidiReadObject")(metadata=metadata)
        self.task = asyncio.get_running_loop().create_task(self._pump())
        await self._send(request)

    async def add(self, read: RangeRead) -> None:
        request = pb().BidiReadObjectRequest()
        request.read_ranges.append(self._range(read))
        self.reads[read.read_id] = read
        if self.opening is not None and not self.opening.is_set():
            await self.opening.wait()  # the open awaits credentials: no call yet
        await self._send(request)

    async def _send(self, request: Any) -> None:
        async with self._lock:
            if self.closed:
                raise TransientError(
                    "the read stream ended", operation="get", uri=self.owner.uri(self.key)
                )
            try:
                await self.call.write(request)
            except asyncio.CancelledError:
                # grpc.aio raises CancelledError on a write to a call cancelled
                # here (another range of the stream failed and ended it): that
                # is this range's failed attempt, not this task's cancellation.
                task = asyncio.current_task()
                cancelling = getattr(task, "cancelling", None)
                if (cancelling is not None and cancelling()) or not (
                    self.closed or self.call.cancelled()
                ):
                    raise
                raise TransientError(
                    "the read stream was ended by another range's failure",
                    operation="get",
                    uri=self.owner.uri(self.key),
                ) from None
            except Exception as exc:  # the server ended the stream meanwhile
                raise TransientError(
                    f"the read stream ended ({type(exc).__name__})",
                    operation="get",
                    uri=self.owner.uri(self.key),
                ) from exc

    def drop(self, read: RangeRead) -> None:
        """Forget ``read`` (done, failed or cancelled); end the stream once idle."""
        self.reads.pop(read.read_id, None)
        if not self.reads and not self.closed:
            self.closed = True
            self.owner.forget(self)
            if self.call is not None:
                self.call.cancel()

    async def finish(self, read: RangeRead) -> None:
        """Forget ``read``, done; once idle, end the stream by half-closing it.

        A half-close costs a fraction of a cancellation in grpc.aio, and the
        server ends the stream on it.
        """
        self.reads.pop(read.read_id, None)
        if not self.reads and not self.closed:
            self.closed = True
            self.owner.forget(self)
            try:
                async with self._lock:
                    await self.call.done_writing()
            except Exception:  # ended already: nothing to close
                self.call.cancel()

    async def _pump(self) -> None:
        error: StorageError | None = None
        try:
            while True:
                resp = await self.call.read()
                if resp is EOF:
                    break
                self._receive(resp)
        except asyncio.CancelledError:
            if not self.closed:
                raise
        except StorageError as exc:
            error = exc
        except Exception as exc:  # grpc.aio.AioRpcError and friends
            self.owner.note_redirect(self.key, self.meta, exc)
            error = error_for_rpc(exc, operation="get", uri=self.owner.uri(self.key))
        finally:
            self.closed = True
            self.owner.forget(self)
            if self.reads:
                self.call.cancel()
                if error is None:
                    error = TransientError(
                        "the read stream ended before the range did",
                        operation="get",
                        uri=self.owner.uri(self.key),
                    )
                for read in list(self.reads.values()):
                    if read.done is not None and not read.done.done():
                        read.done.set_exception(error)
                self.reads.clear()

    def _receive(self, resp: Any) -> None:
        ranges: list[Range]
        if isinstance(resp, RangeData):  # range data alone, parsed by hand
            ranges = resp.ranges
        else:
            if resp.HasField("metadata"):
                self.meta = meta_of(resp.metadata)
                if self.on_meta is not None:
                    self.on_meta(self.key, self.meta)
            if resp.HasField("read_handle") and self.meta is not None:
                self.owner.remember(self.key, self.meta, resp.read_handle.handle, None)
            ranges = [_range_of(data) for data in resp.object_data_ranges]
        for read_id, offset, content, sent, range_end in ranges:
            read = self.reads.get(read_id)
            if read is None:
                continue  # a read cut short by its attempt's timeout
            if read.meta is None:
                read.meta = self.meta
            uri = self.owner.uri(self.key)
            if offset != read.pos:
                raise TransientError(
                    f"range data at {offset}, expected {read.pos}", operation="get", uri=uri
                )
            accounting.received(len(content))
            if sent is not None:
                if crc32c.extend(0, content) != sent:
                    raise IntegrityError(
                        f"a chunk at offset {offset} does not match its CRC32C",
                        operation="get",
                        uri=uri,
                    )
                if read.whole_crc or read.crc_all:
                    read.crc = crc32c.combine(read.crc, sent, len(content))
            elif read.whole_crc:
                read.crc = crc32c.extend(read.crc, content)
            else:
                read.crc_known = False
            read.sink(offset, content)
            read.pos += len(content)
            if range_end:
                self._finish(read)

    def _finish(self, read: RangeRead) -> None:
        # A stream opened again with a read handle may send no metadata: the
        # read's first stream did.
        meta = self.meta or read.meta
        if meta is None:
            raise TransientError("range data before the object's metadata", operation="get")
        if (
            read.whole_crc
            and meta.crc32c is not None
            and meta.finalized
            and (read.pos != meta.size or read.crc != meta.crc32c)
        ):
            raise IntegrityError(
                f"read {read.pos} bytes with CRC32C {crc32c.b64(read.crc)}; the object "
                f"has {meta.size} with {crc32c.b64(meta.crc32c)}",
                operation="get",
                uri=self.owner.uri(self.key),
            )
        if read.end is not None and read.pos < min(read.end, meta.size):
            raise TransientError(
                f"range ended at {read.pos}, short of {min(read.end, meta.size)}",
                operation="get",
                uri=self.owner.uri(self.key),
            )
        self.reads.pop(read.read_id, None)
        if read.done is not None and not read.done.done():
            read.done.set_result(meta)


class ReadStreams:
    """The read streams of one bucket on one channel, shared by concurrent reads.

    Args:
        channels: The endpoint's channel (per process and loop).
        bucket: The bucket name.
        metadata: Makes the call metadata (routing and authorization).
        uri: ``gs://bucket/key`` of a key, for errors.
        quiet: ``RetryConfig.read_timeout``: an attempt that receives nothing
            for this long fails (``TransientError``) and its stream takes no
            more reads, as the JSON path's watchdog cuts a silent body short.
    """

    def __init__(
        self,
        channels: Channels,
        bucket: str,
        metadata: Callable[[], Any],
        uri: Callable[[str], str],
        quiet: float | None = None,
    ) -> None:
        self.channels = channels
        self.quiet = quiet
        self.bucket_name = bucket_path(bucket)
        self.metadata = metadata
        self.uri = uri
        #: (name, generation) -> (read handle, routing token, metadata), the
        #: latest few: a read resumed on that generation skips the lookup.
        self.handles: dict[tuple[str, int | None], tuple[bytes | None, str | None, Meta]] = {}
        self._open: dict[tuple[str, int | None], _Stream] = {}

    def forget(self, stream: _Stream) -> None:
        """Stop handing ``stream`` to new reads."""
        k = (stream.key, stream.generation)
        if self._open.get(k) is stream:
            del self._open[k]

    def remember(self, key: str, meta: Meta, handle: bytes | None, token: str | None) -> None:
        """Keep a stream's read handle (or a redirect's) for a read of its generation."""
        handles = self.handles
        handles.pop((key, meta.generation), None)
        handles[(key, meta.generation)] = (handle, token, meta)
        if len(handles) > _HANDLES_KEPT:
            del handles[next(iter(handles))]

    def note_redirect(self, key: str, meta: Meta | None, exc: BaseException) -> None:
        """Keep the read handle and routing token a redirect carries, for the next open."""
        if meta is None:
            return  # a redirect before the object was named: the next open asks afresh
        trailing = getattr(exc, "trailing_metadata", None)
        if not callable(trailing):
            return
        try:
            pairs = trailing() or ()
        except Exception:  # a call that never reached the server has none
            return
        for name, value in pairs:
            if name != "grpc-status-details-bin":
                continue
            from google.rpc import status_pb2

            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                redirect = pb().BidiReadObjectRedirectedError()
                if detail.Unpack(redirect):
                    self.remember(
                        key,
                        meta,
                        redirect.read_handle.handle or None,
                        redirect.routing_token or None,
                    )

    async def read(
        self,
        key: str,
        generation: int | None,
        read: RangeRead,
        on_meta: Callable[[str, Meta], None] | None = None,
        fresh: bool = False,
    ) -> Meta:
        """One attempt at ``read``: from ``read.pos`` on, on a shared stream.

        ``read.pos`` keeps what arrived, so another attempt resumes there.
        ``on_meta(key, meta)`` sees the object's metadata before any of its
        bytes, and may raise to stop every read of the stream. ``fresh``: on
        a new stream of its own, which no other read shares (a hedge).
        """
        read.done = asyncio.get_running_loop().create_future()
        if generation is None and read.meta is not None:
            generation = read.meta.generation  # a resumed read stays on its generation
        stream = None if fresh else self._open.get((key, generation))
        if stream is None or stream.closed or len(stream.reads) >= MAX_RANGES_PER_STREAM:
            stream = _Stream(self, key, generation, on_meta)
            if not fresh:
                self._open[(key, generation)] = stream
        accounting.count("get")
        dog = watchdog(asyncio.get_running_loop())
        watch = dog.start(quiet=self.quiet, progress=lambda: read.pos)
        try:
            if stream.opening is None:
                await stream.open(read)
            else:
                await stream.add(read)
            meta = await read.done
        except BaseException as exc:
            stream.drop(read)
            if read.done.done() and not read.done.cancelled():
                read.done.exception()  # retrieved: raised here, or a later stream's
            if isinstance(exc, asyncio.CancelledError) and dog.stop(watch):
                self.forget(stream)  # silent: the next attempt opens another stream
                raise TransientError(
                    f"no data from the server for {self.quiet:g} s (read timeout)",
                    operation="get",
                    uri=self.uri(key),
                ) from None
            raise
        finally:
            dog.stop(watch)
        await stream.finish(read)
        return meta
