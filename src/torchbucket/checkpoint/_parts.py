"""The part buffers of a checkpoint save, their sizes, and the checks of what was saved.

Parts start at ``CheckpointConfig.part_size`` (larger for a huge ``size_hint``)
and double every 1,000 parts, so any size fits the 10,000 parts a multipart
upload may have. Their buffers are reused between parts. Once the upload is
finished, what the store holds is compared with what was written (size and
CRC32C), both after a normal completion and after one whose answer was lost.
"""

from __future__ import annotations

import logging
import math
import threading

from torchbucket import runtime
from torchbucket.checkpoint.config import CheckpointConfig, MiB
from torchbucket.errors import IntegrityError, NotFoundError, StorageError
from torchbucket.storage.base import MULTIPART_MAX_PARTS, ObjectInfo, ObjectStore

__all__ = ["BufferPool", "first_part_size", "part_size", "saved_anyway", "verify_saved"]

logger = logging.getLogger(__name__)

#: Parts double in size after every this many, so any size fits 10,000 parts.
_GROWTH_PERIOD = 1000


class BufferPool:
    """Part buffers reused between parts, so each save touches its memory once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[bytearray] = []
        self._size = 0
        self.live = 0
        self.peak_live = 0

    def take(self, size: int) -> bytearray:
        with self._lock:
            if size != self._size:
                self._free.clear()
                self._size = size
            buffer = self._free.pop() if self._free else bytearray(size)
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)
            return buffer

    def give(self, buffer: bytearray) -> None:
        with self._lock:
            self.live -= 1
            if len(buffer) == self._size:
                self._free.append(buffer)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


def first_part_size(config: CheckpointConfig, size_hint: int | None) -> int:
    """The size of the first parts: ``part_size``, larger for a huge ``size_hint``."""
    if not size_hint:
        return config.part_size
    # Leave a tenth of the part numbers as slack for a hint that was low.
    needed = math.ceil(size_hint / (MULTIPART_MAX_PARTS * 9 // 10))
    return max(config.part_size, math.ceil(needed / MiB) * MiB)


def part_size(base: int, number: int) -> int:
    """The size of part ``number`` (1-based) when the first parts are ``base`` bytes."""
    return base << ((number - 1) // _GROWTH_PERIOD)


def saved_anyway(store: ObjectStore, key: str, written: int, crc32c: str) -> ObjectInfo | None:
    """The object ``key``, if it holds exactly ``written`` bytes with ``crc32c``."""
    try:
        info = runtime.run(store.head(key))
    except NotFoundError:
        return None
    except StorageError:
        logger.debug(
            "%s: could not check the object after a failed save", store.uri(key), exc_info=True
        )
        return None
    if info.size == written and info.crc32c == crc32c:
        return info
    return None


def verify_saved(
    store: ObjectStore, key: str, info: ObjectInfo, written: int, crc32c: str
) -> ObjectInfo:
    """``info`` if the saved object is ``written`` bytes with ``crc32c``; else delete it and raise.

    An answer without a CRC32C is completed by asking ``key``; if ``key`` holds
    another generation by then, another writer's save replaced this one (the
    last to finish wins), and that object is neither checked nor deleted.

    Raises:
        IntegrityError: It differs (it was deleted), naming the checkpoint.
    """
    uri = store.uri(key)
    if info.crc32c is None:
        live = runtime.run(store.head(key))
        if info.generation is not None and live.generation != info.generation:
            logger.debug(
                "%s: replaced (generation %s) before generation %s was checked; "
                "the other save stands",
                uri,
                live.generation,
                info.generation,
            )
            return info
        info = live
    if info.crc32c is None:
        logger.debug("%s: the store reports no CRC32C; size checked only", uri)
    if info.size == written and info.crc32c in (None, crc32c):
        return info
    if info.generation is not None:
        runtime.run(store.delete(key, generation=info.generation))
    raise IntegrityError(
        f"the saved object ({info.size} bytes, crc32c {info.crc32c}) differs from what "
        f"was written ({written} bytes, crc32c {crc32c}); it was deleted",
        operation="checkpoint save",
        uri=uri,
    )
