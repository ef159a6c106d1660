"""Hedged gRPC reads: a slow range read again on a bidi read stream of its own.

The JSON path's hedging (:mod:`._hedge`) with the same :class:`~._hedge.Hedger`:
one ``HedgeConfig``, one budget, the same size classes and counters. An attempt
of a :class:`~._grpc_read.RangeRead` runs on its shared stream; once it is
slow, the spare asks for the same bytes on a new stream for the object (never
the stalled one: :meth:`~._grpc_read.ReadStreams.read` with ``fresh``), pinned
to the generation the read has seen, if any, so a resumed read never mixes two
versions. The spare's chunks are checked as any (each chunk's CRC32C, a whole
object's CRC32C) and kept apart from the caller's sink; the first complete
answer wins. A spare that wins cancels the first request (its read leaves its
stream, which is cancelled once it has no read left) and its chunks are then
handed to the sink, from where the attempt began, over whatever the first
request had written; a first request that wins cancels the spare, and its
stream with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torchbucket.storage.gcs._grpc_data import Meta
from torchbucket.storage.gcs._grpc_read import RangeRead, ReadStreams
from torchbucket.storage.gcs._hedge import Hedger

__all__ = ["Parts", "attempt"]

_Answer = tuple[RangeRead, list[tuple[int, bytes]], Meta]


async def attempt(
    reads: ReadStreams,
    hedger: Hedger | None,
    key: str,
    generation: int | None,
    read: RangeRead,
    on_meta: Callable[[str, Meta], None] | None,
) -> Meta:
    """One attempt at ``read`` (see :meth:`ReadStreams.read`), hedged by ``hedger`` if slow."""
    if hedger is None:
        return await reads.read(key, generation, read, on_meta)
    # Where this attempt begins: a spare asks for the rest from here, with the
    # CRC32C of what came before, so a whole object's check still holds.
    begin, crc, known = read.pos, read.crc, read.crc_known

    async def spare() -> _Answer:
        got: list[tuple[int, bytes]] = []
        other = RangeRead(
            read.start,
            read.end,
            lambda offset, data: got.append((offset, bytes(data))),
            pos=begin,
            crc=crc,
            crc_all=read.crc_all,
            crc_known=known,
            meta=read.meta,  # the generation the first request saw, if it saw one
        )
        meta = await reads.read(key, generation, other, on_meta, fresh=True)
        return other, got, meta

    def adopt(answer: _Answer) -> Meta:
        other, got, meta = answer
        for offset, data in got:
            read.sink(offset, data)
        read.pos, read.crc, read.crc_known = other.pos, other.crc, other.crc_known
        read.meta = other.meta
        return meta

    first = functools.partial(reads.read, key, generation, read, on_meta)
    return await hedger.run(first, spare, adopt, None if read.end is None else read.end - begin)


class Parts:
    """The chunks of one read in order, as a :class:`RangeRead` sink.

    A chunk at an offset already held replaces what was held from there on:
    a hedge's answer handed over after its first request wrote part of the
    same bytes.
    """

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self._offsets: list[int] = []

    def sink(self, offset: int, data: bytes | memoryview) -> None:
        """Keep ``data`` (a copy), the bytes at ``offset``."""
        offsets = self._offsets
        while offsets and offsets[-1] >= offset:
            offsets.pop()
            self.chunks.pop()
        offsets.append(offset)
        self.chunks.append(bytes(data))

    def join(self) -> bytes:
        """The bytes read."""
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
