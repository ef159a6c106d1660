"""One shard written: its members read ahead, its parts uploaded, then checked and indexed.

The multipart path of :func:`torchbucket.shards.apack`; a store without
multipart upload (a zonal bucket) streams the shard (``_pack_stream.py``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING

from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.runtime.tasks import cancel_and_wait
from torchbucket.shards._index import ManifestShard, ShardIndex, index_name
from torchbucket.shards._pack_stream import stream_shard
from torchbucket.shards._plan import PlannedMember, PlannedShard
from torchbucket.shards._progress import Progress
from torchbucket.shards._tar import END_OF_ARCHIVE, padding
from torchbucket.shards.config import PackConfig
from torchbucket.storage.base import ObjectInfo, ObjectStore, Part
from torchbucket.storage.capabilities import SupportsZonal
from torchbucket.storage.crc32c import Crc32c, extend

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["complete", "write_shard"]

logger = logging.getLogger(__name__)

_PARTS_IN_FLIGHT = 2


async def _read(store: ObjectStore, info: ObjectInfo) -> bytes:
    data = await store.get(info.name, generation=info.generation)
    if len(data) != info.size:
        raise IntegrityError(
            f"read {len(data)} bytes, listed with {info.size}: it changed during the pack",
            operation="pack read",
            uri=store.uri(info.name),
        )
    return data


class _Parts:
    """A shard's parts, uploading in the background, at most ``_PARTS_IN_FLIGHT`` at once.

    A part that failed raises at the next :meth:`send`, or at :meth:`finish`.
    """

    def __init__(self, dst: ObjectStore, key: str, upload_id: str) -> None:
        self.dst, self.key, self.upload_id = dst, key, upload_id
        self.parts: dict[int, Part] = {}
        self.uploads: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(_PARTS_IN_FLIGHT)
        self.failure: list[BaseException] = []
        self.number = 1

    async def _put(self, number: int, data: bytes) -> None:
        try:
            self.parts[number] = await self.dst.multipart_upload_part(
                self.key, self.upload_id, number, data
            )
        except Exception as exc:  # raised by the writer, at its next part
            self.failure.append(exc)
        finally:
            self.slots.release()

    async def send(self, buffer: bytearray, total: Crc32c) -> None:
        """Upload the buffer's bytes as the next part (adding them to ``total``), and empty it."""
        chunk = bytes(buffer)
        buffer.clear()
        total.update(chunk)
        if self.failure:
            raise self.failure[0]
        await self.slots.acquire()
        task = asyncio.ensure_future(self._put(self.number, chunk))
        self.number += 1
        self.uploads.add(task)
        task.add_done_callback(self.uploads.discard)

    async def finish(self) -> list[Part]:
        """Every part, in order, once all are uploaded."""
        if self.uploads:
            await asyncio.gather(*list(self.uploads))
        if self.failure:
            raise self.failure[0]
        return [self.parts[n] for n in sorted(self.parts)]


def _read_ahead(
    src: ObjectStore,
    reads: collections.deque[asyncio.Task[bytes]],
    pending: Iterator[PlannedMember],
    in_flight: int,
) -> None:
    """Start reads of the next members until ``in_flight`` are running."""
    while len(reads) < in_flight:
        nxt: PlannedMember | None = next(pending, None)
        if nxt is None:
            break
        reads.append(asyncio.ensure_future(_read(src, nxt.source)))


async def write_shard(
    src: ObjectStore,
    dst: ObjectStore,
    prefix: str,
    shard: PlannedShard,
    config: PackConfig,
    bar: Progress,
) -> ManifestShard:
    key = prefix + shard.name
    uri = dst.uri(key)
    if isinstance(dst, SupportsZonal) and await dst.zonal():
        # No multipart upload on a zonal bucket: one stream, checked as a whole.
        return await _indexed(
            dst, prefix, shard, *await stream_shard(src, dst, key, shard, config, bar, _read)
        )
    upload_id = await dst.multipart_initiate(key, content_type="application/x-tar")
    parts = _Parts(dst, key, upload_id)
    reads: collections.deque[asyncio.Task[bytes]] = collections.deque()
    pending = iter(shard.members)
    crcs: list[int] = []
    total = Crc32c()
    buffer = bytearray()
    try:
        for member in shard.members:
            _read_ahead(src, reads, pending, config.reads_in_flight)
            data = await reads.popleft()
            crcs.append(extend(0, data))
            buffer += member.header
            buffer += data
            buffer += b"\0" * padding(len(data))
            bar.update(len(data))
            del data
            if len(buffer) >= config.part_size:
                await parts.send(buffer, total)
        buffer += END_OF_ARCHIVE
        await parts.send(buffer, total)
        info = await dst.multipart_complete(key, upload_id, await parts.finish())
    except BaseException:
        await cancel_and_wait([*reads, *parts.uploads])
        try:
            await asyncio.shield(dst.multipart_abort(key, upload_id))
        except Exception:  # the upload may already be gone; nothing was made visible
            logger.debug("aborting the upload of %s failed", uri, exc_info=True)
        raise
    return await _indexed(dst, prefix, shard, info, crcs, total)


async def _indexed(
    dst: ObjectStore,
    prefix: str,
    shard: PlannedShard,
    info: ObjectInfo,
    crcs: list[int],
    total: Crc32c,
) -> ManifestShard:
    """Check the shard written against the plan, then write its index."""
    uri = dst.uri(prefix + shard.name)
    key = prefix + shard.name
    if info.size != shard.size or (info.crc32c is not None and info.crc32c != total.b64()):
        await dst.delete(key)
        raise IntegrityError(
            f"the shard written is {info.size} bytes (CRC32C {info.crc32c}), the plan says "
            f"{shard.size} bytes (CRC32C {total.b64()}); deleted it",
            operation="pack",
            uri=uri,
        )
    index = ShardIndex(
        [m.name for m in shard.members],
        [m.data_offset for m in shard.members],
        [m.source.size for m in shard.members],
        crcs,
        shard.sample_starts,
        size=shard.size,
        fingerprint=shard.fingerprint,
        shard_crc32c=total.b64(),
    )
    await dst.put(
        prefix + index_name(shard.name), index.to_json(shard.name), content_type="application/json"
    )
    logger.info("packed %s: %d members, %d bytes", uri, len(shard.members), shard.size)
    return _manifest_entry(shard, total.b64())


def _manifest_entry(shard: PlannedShard, crc32c: str) -> ManifestShard:
    return ManifestShard(
        name=shard.name,
        size=shard.size,
        crc32c=crc32c,
        samples=len(shard.sample_starts),
        members=len(shard.members),
        fingerprint=shard.fingerprint,
    )


async def complete(
    dst: ObjectStore, prefix: str, shard: PlannedShard, existing: dict[str, ObjectInfo]
) -> ManifestShard | None:
    """The manifest entry of a shard already written by the same plan, else ``None``."""
    tar = existing.get(prefix + shard.name)
    idx_key = prefix + index_name(shard.name)
    if tar is None or idx_key not in existing or tar.size != shard.size:
        return None
    try:
        index = ShardIndex.from_json(await dst.get(idx_key))
    except (NotFoundError, ValueError):
        return None
    if index.fingerprint != shard.fingerprint or index.size != shard.size:
        return None
    return _manifest_entry(shard, index.shard_crc32c or tar.crc32c or "")
