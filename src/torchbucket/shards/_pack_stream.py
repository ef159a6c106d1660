"""A shard written as one streamed upload, for a store without multipart upload.

On a zonal (Rapid) bucket there is no multipart upload: the pack streams each
shard through ``put_stream`` (an appendable object, checked whole before the
shard's name takes it), its members read ahead as the multipart path reads
them (``shards/_pack.py``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable

from torchbucket.runtime.tasks import cancel_and_wait
from torchbucket.shards._plan import PlannedMember, PlannedShard
from torchbucket.shards._progress import Progress
from torchbucket.shards._tar import END_OF_ARCHIVE, padding
from torchbucket.shards.config import PackConfig
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.crc32c import Crc32c, extend

__all__ = ["stream_shard"]


async def stream_shard(
    src: ObjectStore,
    dst: ObjectStore,
    key: str,
    shard: PlannedShard,
    config: PackConfig,
    bar: Progress,
    read: Callable[[ObjectStore, ObjectInfo], Awaitable[bytes]],
) -> tuple[ObjectInfo, list[int], Crc32c]:
    """Write a shard as one streamed upload (``put_stream``), its members read ahead.

    Returns:
        The object written, the CRC32C of each member's data, and the shard's.
    """
    crcs: list[int] = []
    total = Crc32c()
    reads: collections.deque[asyncio.Task[bytes]] = collections.deque()

    async def chunks() -> AsyncIterator[bytes]:
        pending = iter(shard.members)
        buffer = bytearray()
        try:
            for member in shard.members:
                while len(reads) < config.reads_in_flight:
                    nxt: PlannedMember | None = next(pending, None)
                    if nxt is None:
                        break
                    reads.append(asyncio.ensure_future(read(src, nxt.source)))
                data = await reads.popleft()
                crcs.append(extend(0, data))
                buffer += member.header
                buffer += data
                buffer += b"\0" * padding(len(data))
                bar.update(len(data))
                if len(buffer) >= config.part_size:
                    chunk = bytes(buffer)
                    buffer.clear()
                    total.update(chunk)
                    yield chunk
            buffer += END_OF_ARCHIVE
            chunk = bytes(buffer)
            total.update(chunk)
            yield chunk
        finally:
            await cancel_and_wait(reads)

    info = await dst.put_stream(key, chunks(), content_type="application/x-tar")
    return info, crcs, total
