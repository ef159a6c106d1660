"""Hedged gRPC reads (``storage/gcs/_grpc_hedge.py``) against a scripted stand-in for the streams.

What a zonal reader relies on when a range stalls: the hedge asks on a new
stream of its own, for what the attempt has not received yet, on the
generation the read already saw; the bytes handed over are exactly the
object's, the CRC32C of a resumed read still covers all of it, and the
stalled request is cancelled. The real streams are in ``test_grpc_zonal.py``
and ``tests/integration/test_hedged_reads.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from torchbucket.config import HedgeConfig
from torchbucket.storage import crc32c
from torchbucket.storage.gcs._grpc_data import Meta
from torchbucket.storage.gcs._grpc_hedge import Parts, attempt
from torchbucket.storage.gcs._grpc_read import RangeRead
from torchbucket.storage.gcs._hedge import Hedger

DATA = random.Random(3).randbytes(10_000)
META = Meta(
    size=len(DATA),
    generation=7,
    crc32c=crc32c.extend(0, DATA),
    metadata={},
    content_type="",
    finalized=True,
)
EAGER = HedgeConfig(budget=1.0, burst=1.0, initial_wait=0.05, floor=0.05)


class _Streams:
    """Stands in for ``ReadStreams``: the shared stream stalls after ``stall_at`` bytes."""

    def __init__(self, stall_at: int) -> None:
        self.stall_at = stall_at
        self.asked: list[tuple[bool, int, int | None]] = []
        self.stalled_cancelled = False

    async def read(
        self,
        key: str,
        generation: int | None,
        read: RangeRead,
        on_meta: Callable[[str, Meta], None] | None = None,
        fresh: bool = False,
    ) -> Meta:
        if generation is None and read.meta is not None:
            generation = read.meta.generation  # as ReadStreams.read pins it
        self.asked.append((fresh, read.pos, generation))
        read.meta = read.meta or META
        stop = len(DATA) if read.end is None else read.end
        if not fresh:
            cut = min(stop, self.stall_at)
            self._send(read, cut)
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.stalled_cancelled = True
                raise
        self._send(read, stop)
        return META

    def _send(self, read: RangeRead, stop: int) -> None:
        for at in range(read.pos, stop, 1000):
            chunk = DATA[at : min(stop, at + 1000)]
            read.crc = crc32c.combine(read.crc, crc32c.extend(0, chunk), len(chunk))
            read.sink(at, memoryview(chunk))
            read.pos += len(chunk)


def _hedged(streams: _Streams, read: RangeRead) -> Meta:
    async def run() -> Meta:
        return await attempt(streams, Hedger(EAGER), "k", None, read, None)  # type: ignore[arg-type]

    return asyncio.run(asyncio.wait_for(run(), timeout=30))


def test_a_stalled_read_is_answered_by_its_hedge_on_a_fresh_stream() -> None:
    streams = _Streams(stall_at=4_500)
    parts = Parts()
    read = RangeRead(0, None, parts.sink, crc_all=True)
    assert _hedged(streams, read) == META
    # The hedge: a stream of its own, from where the attempt began, on the
    # generation the stalled request had seen.
    assert streams.asked == [(False, 0, None), (True, 0, 7)]
    assert streams.stalled_cancelled
    assert parts.join() == DATA  # what the stalled request wrote is replaced, not kept
    assert read.pos == len(DATA) and read.crc == crc32c.extend(0, DATA)


def test_a_resumed_read_is_hedged_from_where_it_resumed_on_its_generation() -> None:
    # An earlier attempt received 3,000 bytes and the object's metadata; this
    # attempt stalls after 6,000: the hedge asks for the rest from 3,000, on
    # generation 7, and the read's CRC32C still covers every byte from 0.
    streams = _Streams(stall_at=6_000)
    buffer = bytearray(len(DATA))

    def sink(offset: int, data: Any) -> None:
        buffer[offset : offset + len(data)] = data

    head = DATA[:3_000]
    buffer[:3_000] = head
    read = RangeRead(0, len(DATA), sink, pos=3_000, crc=crc32c.extend(0, head), crc_all=True)
    read.meta = META
    assert _hedged(streams, read) == META
    assert streams.asked == [(False, 3_000, 7), (True, 3_000, 7)]
    assert bytes(buffer) == DATA
    assert read.pos == len(DATA) and read.crc == crc32c.extend(0, DATA)


def test_a_read_that_answers_in_time_is_not_hedged() -> None:
    streams = _Streams(stall_at=len(DATA))

    async def quick(*args: Any, **kw: Any) -> Meta:
        read: RangeRead = args[2]
        streams._send(read, len(DATA))
        return META

    streams.read = quick  # type: ignore[method-assign]
    parts = Parts()
    read = RangeRead(0, None, parts.sink)
    hedger = Hedger(EAGER)

    async def run() -> Meta:
        return await attempt(streams, hedger, "k", None, read, None)  # type: ignore[arg-type]

    assert asyncio.run(run()) == META
    assert parts.join() == DATA and hedger.hedges == 0 and hedger.reads == 1


def test_parts_replace_what_a_hedge_hands_over_again() -> None:
    parts = Parts()
    parts.sink(0, b"ab")
    parts.sink(2, memoryview(b"cX"))
    parts.sink(2, b"cd")  # the hedge's bytes from offset 2 replace the stalled request's
    parts.sink(4, b"e")
    assert parts.join() == b"abcde"
