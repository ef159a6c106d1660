"""Streaming the samples of a worker's pieces of shards, with ranged reads in flight.

The byte ranges a worker needs (a piece of an indexed shard: from its first
sample's data to its last one's; a shard without an index: all of it) are cut
into reads of ``first_range_size`` doubling up to ``range_size``, kept going
on the runtime's loop across shard boundaries (at most ``reads_in_flight``
and ``prefetch_size``, starting with one read and one more per read
taken), each into a buffer of its own (``get_into``). The consumer (a DataLoader worker's thread) takes them in
order and cuts samples out: with an index by the members' offsets, each
member checked against its CRC32C (re-read once on a mismatch, then an
error naming the shard and the member); without one by parsing the tar
headers as they stream by, the whole shard checked against its CRC32C at its
end, and a shard that ends inside a member or without the end-of-archive
blocks an error naming the shard and the member.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from torchbucket import runtime
from torchbucket.errors import IntegrityError
from torchbucket.shards._catalog import ShardSet
from torchbucket.shards._split import Piece
from torchbucket.shards._tar import BLOCK, HeaderError, padding, parse_header, parse_pax, split_key
from torchbucket.shards.config import ShardReadConfig
from torchbucket.storage.crc32c import b64, extend

__all__ = ["END_OF_PIECE", "cut_reads", "member_sample", "stream_samples"]

#: The sample index :func:`stream_samples` yields when a piece is done.
END_OF_PIECE = -1


class _Short(Exception):
    """The shard ended before the bytes asked for."""


def cut_reads(
    ranges: Sequence[tuple[int, int, int]], config: ShardReadConfig
) -> Iterator[tuple[int, int, int]]:
    """The ranged reads of ``(piece, start, end)`` byte ranges, in order.

    ``first_range_size`` first, each next one twice as large up to
    ``range_size``, across piece boundaries; a range's last read ends with it.
    """
    size = config.first_range_size
    for piece, start, end in ranges:
        pos = start
        while pos < end:
            stop = min(end, pos + size)
            yield piece, pos, stop
            pos = stop
            size = min(config.range_size, size * 2)


class _Chunks:
    """Ordered ranged reads over pieces, in flight ahead of the consumer.

    Each read lands in a buffer of its own (``get_into``: on GCS the body is
    received in place, no copy on the way). The reads in flight are bounded by
    ``reads_in_flight`` and by ``prefetch_size`` (bytes asked for and not
    yet taken; one read always goes), and start slowly: one read at first,
    one more allowed per read taken, so that the first, small reads are not
    slowed down by large ones competing for the same connection, CPU and
    bandwidth, and the first samples come as soon as the first bytes do.
    """

    def __init__(
        self,
        shards: ShardSet,
        ranges: Sequence[tuple[int, int, int]],
        piece_shard: Sequence[int],
        config: ShardReadConfig,
    ) -> None:
        self._shards = shards
        self._piece_shard = piece_shard
        self._plan = cut_reads(ranges, config)
        self._next = next(self._plan, None)
        self._max_reads = config.reads_in_flight
        self._max_bytes = config.prefetch_size
        self._taken = 0
        self._asked = 0
        self._futures: collections.deque[
            tuple[int, int, int, concurrent.futures.Future[memoryview]]
        ] = collections.deque()
        self._fill()

    def _fill(self) -> None:
        allowed = min(self._max_reads, 1 + self._taken)
        while self._next is not None and len(self._futures) < allowed:
            piece, start, end = self._next
            if self._futures and self._asked + (end - start) > self._max_bytes:
                return
            info = self._shards.shards[self._piece_shard[piece]]
            future = runtime.submit(
                _read_into(self._shards, info.name, start, end, info.generation)
            )
            self._futures.append((piece, start, end, future))
            self._asked += end - start
            self._next = next(self._plan, None)

    def take(self, piece: int) -> tuple[int, int, memoryview] | None:
        """The next read of ``piece``: ``(start, end asked, bytes)``; ``None`` when it has none."""
        if not self._futures or self._futures[0][0] != piece:
            return None
        _, start, end, future = self._futures.popleft()
        data = future.result()
        self._asked -= end - start
        self._taken += 1
        self._fill()
        return start, end, data

    def close(self) -> None:
        for *_, future in self._futures:
            future.cancel()
        self._futures.clear()
        self._next = None
        self._plan = iter(())


async def _read_into(
    shards: ShardSet, name: str, start: int, end: int, generation: int | None
) -> memoryview:
    """``[start, end)`` of a shard (less at its end), in a buffer of its own."""
    buffer = bytearray(end - start)
    got = await shards.store.get_into(name, memoryview(buffer), start=start, generation=generation)
    return memoryview(buffer)[:got]


class _Cursor:
    """The bytes of one piece, by absolute offset, read forward.

    With ``whole_crc`` (a shard without an index) the CRC32C of everything
    taken is kept in ``crc``; with an index each member is checked instead.
    """

    def __init__(self, chunks: _Chunks, piece: int, *, whole_crc: bool = False) -> None:
        self._chunks = chunks
        self._piece = piece
        self._held: collections.deque[tuple[int, memoryview]] = collections.deque()
        self._short = False
        self._whole_crc = whole_crc
        self.crc = 0
        self.end = 0

    def _take(self) -> bool:
        if self._short:
            return False
        chunk = self._chunks.take(self._piece)
        if chunk is None:
            return False
        c_start, c_end, data = chunk
        if self._whole_crc:
            self.crc = extend(self.crc, data)
        self.end = c_start + len(data)
        if len(data) < c_end - c_start:
            self._short = True
        self._held.append((c_start, data))
        return True

    def read(self, start: int, end: int) -> bytes:
        held = self._held
        while held and held[0][0] + len(held[0][1]) <= start:
            held.popleft()
        while not held or held[-1][0] + len(held[-1][1]) < end:
            if not self._take():
                raise _Short
        first_start, first = held[0]
        if first_start + len(first) >= end:
            return first[start - first_start : end - first_start].tobytes()
        parts = [first[start - first_start :]]
        for c_start, data in list(held)[1:]:
            parts.append(data[: end - c_start])
            if c_start + len(data) >= end:
                break
        return b"".join(parts)

    def drain(self) -> None:
        """Take the piece's remaining reads (the trailing padding of a tar)."""
        self._held.clear()
        while self._take():
            self._held.clear()


def member_sample(members: Sequence[tuple[str, bytes]], group_by: str, url: str) -> Any:
    """A sample: one member's bytes (``group_by="none"``), or a dict of a key's members.

    The dict holds ``__key__``, ``__url__`` (the shard's URI) and the bytes of
    each member under its extension, as WebDataset's samples do.
    """
    if group_by == "none":
        return members[0][1]
    sample: dict[str, Any] = {}
    for name, data in members:
        parts = split_key(name)
        key, ext = parts if parts is not None else (name, "")
        sample["__key__"] = key
        sample[ext] = data
    sample["__url__"] = url
    return sample


def describe_sample(sample: Any, fallback: str = "a sample") -> str:
    """A sample in messages: its key and shard where it is a dict, else ``fallback``."""
    if isinstance(sample, dict):
        return f"sample {sample.get('__key__')!r} of {sample.get('__url__')}"
    return fallback


def _error(shards: ShardSet, shard: int, member: str, what: str) -> IntegrityError:
    return IntegrityError(
        f"member {member!r}: {what}", operation="read shard", uri=shards.uri(shard)
    )


def _indexed(
    shards: ShardSet, chunks: _Chunks, p: int, piece: Piece, skip: int
) -> Iterator[tuple[int, Any]]:
    shard, first, stop = piece
    index = shards.index(shard)
    cursor = _Cursor(chunks, p)
    url = shards.uri(shard)
    # The piece's index entries as Python values once, not numpy scalars per member.
    bounds = index.sample_bounds[first + skip : stop + 1].tolist()
    if not bounds:
        return
    lo, hi = bounds[0], bounds[-1]
    offsets = index.offsets[lo:hi].tolist()
    sizes = index.sizes[lo:hi].tolist()
    crcs = index.crc32c[lo:hi].tolist()
    for i in range(len(bounds) - 1):
        members = []
        for m in range(bounds[i] - lo, bounds[i + 1] - lo):
            off, size = offsets[m], sizes[m]
            try:
                data = cursor.read(off, off + size)
            except _Short:
                raise _error(
                    shards,
                    shard,
                    index.name(lo + m),
                    f"the shard ends at byte {cursor.end}, the member's data is at "
                    f"[{off}, {off + size}) (truncated shard)",
                ) from None
            if extend(0, data) != crcs[m]:
                data = _reread(shards, shard, index.name(lo + m), off, size, crcs[m])
            members.append((index.name(lo + m), data))
        yield skip + i, member_sample(members, shards.group_by, url)


def _reread(shards: ShardSet, shard: int, name: str, off: int, size: int, crc: int) -> bytes:
    """A member whose bytes did not match its CRC32C, read again once."""
    info = shards.shards[shard]
    data = runtime.run(
        shards.store.get(info.name, start=off, end=off + size, generation=info.generation)
    )
    if len(data) != size or extend(0, data) != crc:
        raise _error(
            shards, shard, name, f"CRC32C mismatch at [{off}, {off + size}), also when read again"
        )
    return data


def _headers(
    shards: ShardSet, chunks: _Chunks, p: int, shard: int, skip: int
) -> Iterator[tuple[int, Any]]:
    """Samples of a shard without an index, by its tar headers."""
    cursor = _Cursor(chunks, p, whole_crc=True)
    url = shards.uri(shard)
    pos = 0
    long_name: str | None = None
    last = "(none: the first header)"
    group: list[tuple[str, bytes]] = []
    group_key: str | None = None
    n = 0
    by_key = shards.group_by != "none"

    def read(n_bytes: int, what: str) -> bytes:
        nonlocal pos
        try:
            data = cursor.read(pos, pos + n_bytes)
        except _Short:
            raise _error(
                shards, shard, what, f"the shard ends at byte {cursor.end} (truncated shard)"
            ) from None
        pos += n_bytes
        return data

    while True:
        block = read(BLOCK, f"header after {last}")
        try:
            header = parse_header(block)
        except HeaderError as exc:
            raise _error(
                shards, shard, f"header after {last}", f"not a tar header ({exc})"
            ) from None
        if header is None:
            break
        data = read(header.size, header.name) if header.size else b""
        pos += padding(header.size)
        if header.kind == "pax":
            long_name = parse_pax(data).get("path", long_name)
            continue
        if header.kind == "longname":
            long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if header.kind != "file":
            continue
        name = long_name if long_name is not None else header.name
        long_name = None
        last = repr(name)
        key = split_key(name)
        sample_key = key[0] if (key is not None and by_key) else None
        if group and (not by_key or sample_key is None or sample_key != group_key):
            if n >= skip:
                yield n, member_sample(group, shards.group_by, url)
            n += 1
            group = []
        group.append((name, data))
        group_key = sample_key
    if group:
        if n >= skip:
            yield n, member_sample(group, shards.group_by, url)
        n += 1
    cursor.drain()
    info = shards.shards[shard]
    if cursor.end == info.size and info.crc32c is not None and b64(cursor.crc) != info.crc32c:
        raise IntegrityError(
            f"the shard's CRC32C is {b64(cursor.crc)}, the store says {info.crc32c}",
            operation="read shard",
            uri=url,
        )


def stream_samples(
    shards: ShardSet,
    pieces: Sequence[Piece],
    config: ShardReadConfig,
    *,
    start: tuple[int, int] = (0, 0),
) -> Generator[tuple[int, int, Any], None, None]:
    """The samples of ``pieces`` in order: ``(piece, sample in piece, sample)``.

    After a piece's last sample, ``(piece, END_OF_PIECE, None)``.

    Args:
        shards: The shard set.
        pieces: The worker's pieces.
        config: Read sizes and reads in flight.
        start: ``(piece, sample)`` to begin at.
    """
    first_piece, first_sample = start
    ranges = []
    for p in range(first_piece, len(pieces)):
        shard, first, stop = pieces[p]
        if stop < 0:
            ranges.append((p, 0, shards.shards[shard].size))
            continue
        skip = first_sample if p == first_piece else 0
        if first + skip < stop:
            lo, hi = shards.index(shard).data_range(first + skip, stop)
            ranges.append((p, lo, hi))
    chunks = _Chunks(shards, ranges, [piece[0] for piece in pieces], config)
    try:
        for p in range(first_piece, len(pieces)):
            shard, first, stop = pieces[p]
            skip = first_sample if p == first_piece else 0
            if stop < 0:
                samples = _headers(shards, chunks, p, shard, skip)
            else:
                samples = _indexed(shards, chunks, p, pieces[p], skip)
            for s, sample in samples:
                yield p, s, sample
            yield p, END_OF_PIECE, None
    finally:
        chunks.close()
