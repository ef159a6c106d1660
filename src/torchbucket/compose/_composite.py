"""A composite's bytes: received in place, verified, and cut into its objects."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torchbucket.errors import StorageError
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["Destination", "ReceiveInto", "read_and_cut"]

logger = logging.getLogger(__name__)

# Composites are received in place into buffers kept for the next group. A
# fresh buffer of a few MiB per composite (aiohttp's joined body) cost the
# kernel's zeroing of its pages on first touch: a quarter of a 100 KiB epoch's
# CPU (perf, 2 workers); with the pool, 10,000 x 100 KiB went from 3,640 to
# 4,190 objects/s (medians of 5). Sizes are rounded up so that groups of
# slightly different sizes share buffers.
_BUFFER_ROUND = 256 << 10
_POOL_MAX_BYTES = 64 << 20  # kept per process, free buffers only
_POOL_MAX_BUFFER = 16 << 20  # larger composites get a buffer of their own


class _BufferPool:
    """Free receive buffers of one process, used from the runtime's loop only."""

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._bytes = 0

    def take(self, size: int) -> bytearray:
        fits = [b for b in self._free if len(b) >= size]
        if fits:
            buffer = min(fits, key=len)
            self._free.remove(buffer)
            self._bytes -= len(buffer)
            return buffer
        return bytearray(-(-size // _BUFFER_ROUND) * _BUFFER_ROUND)

    def give(self, buffer: bytearray) -> None:
        if len(buffer) <= _POOL_MAX_BUFFER and self._bytes + len(buffer) <= _POOL_MAX_BYTES:
            self._free.append(buffer)
            self._bytes += len(buffer)

    def clear(self) -> None:
        self._free.clear()
        self._bytes = 0


_pool = _BufferPool()
os.register_at_fork(after_in_child=_pool.clear)  # a DataLoader worker starts empty


class Destination(Protocol):
    """A buffer a composite is received into, and the objects cut from it.

    ``fetch_group(receive_into=...)`` makes one per composite, of the
    composite's size; a group's objects are then ``piece(start, stop)`` of it
    instead of ``bytes`` copies. The datasets' ``FetchConfig(output="tensor")``
    receives a composite into one tensor (shared memory in a DataLoader
    worker) and hands out views of it.
    """

    @property
    def view(self) -> memoryview:
        """The writable bytes the composite is received into."""
        ...

    def piece(self, start: int, stop: int) -> Any:
        """The object at ``[start, stop)`` of the composite."""
        ...


ReceiveInto = Callable[[int], Destination]


async def read_and_cut(
    store: ObjectStore,
    composite: ObjectInfo,
    infos: Sequence[ObjectInfo],
    receive_into: ReceiveInto | None,
) -> list[Any] | None:
    """Read ``composite`` (pinned to its generation) and cut it into ``infos``' objects.

    Args:
        store: Its store.
        composite: The composite as composed, its size checked against the sources'.
        infos: The sources, in order.
        receive_into: Makes the :class:`Destination` to receive into; ``None``:
            a pooled buffer, cut into ``bytes`` copies.

    Returns:
        The objects, or ``None`` when the read failed or came short (the
        group is then read directly).
    """
    if receive_into is not None:
        destination = receive_into(composite.size)
        if not await _read_composite(store, composite, destination.view[: composite.size]):
            return None
        return _cut(infos, destination.piece)
    buffer = _pool.take(composite.size)
    try:
        with memoryview(buffer) as view:
            if not await _read_composite(store, composite, view[: composite.size]):
                return None
            return _cut(infos, lambda a, b: bytes(view[a:b]))
    finally:
        _pool.give(buffer)


async def _read_composite(store: ObjectStore, composite: ObjectInfo, view: memoryview) -> bool:
    """Read the whole composite into ``view``; whether every byte arrived (verified)."""
    try:
        # Pinned to the composite's generation: exactly the object whose size
        # was checked.
        got = await store.get_into(composite.name, view, generation=composite.generation)
    except StorageError as exc:
        logger.debug("reading composite %s failed (%s)", store.uri(composite.name), exc)
        return False
    if got != len(view):
        logger.debug("composite %s: read %d of %d bytes", store.uri(composite.name), got, len(view))
        return False
    return True


def _cut(infos: Sequence[ObjectInfo], piece: Callable[[int, int], Any]) -> list[Any]:
    out: list[Any] = []
    offset = 0
    for info in infos:
        out.append(piece(offset, offset + info.size))
        offset += info.size
    return out
