"""Reading one listed object for a dataset: as ``bytes``, or into a tensor.

With ``FetchConfig(output="tensor")`` an object is received straight into a
1-D ``torch.uint8`` tensor (``ObjectStore.get_into``: on GCS the socket writes
the body where it belongs). In a DataLoader worker that tensor is allocated on
shared memory (``UntypedStorage._new_shared``, what ``default_collate`` uses for
a batch), so when the worker hands a batch to the main process, torch's
multiprocessing pickler sends a handle to the memory instead of the bytes: no
pickling, no pipe, no copy. Such a tensor's pages are mapped in before the
socket writes them (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14 and later;
skipped silently elsewhere): one system call instead of a page fault per 4 KiB,
measured 2.7 -> 2.1 ms of CPU per 4 MiB on a 2-core VM. By default torch's
``file_descriptor`` sharing strategy unlinks each segment as it is made, so a
killed worker leaves nothing behind, and a segment is never reused, since
nothing counts who still maps it. With ``FetchConfig(reuse_shared_memory=True)``
a worker reuses its segments once the main process has let go of them: it
hands them over by handles of its own, which tell it when (``_shm``). Objects read one by one (not through a
composite) are carved in order out of shared segments of a few MiB
(:class:`SharedSlab`), as a composite's objects are views of it: a batch then
costs a handle per segment it draws from. A fresh segment per object cost a
handle per object, and each handle is a connection to the worker's
``resource_sharer`` thread when the main process unpickles the batch: traced
in DataLoader workers, a first batch of 64 such tensors reached the main
process 60-130 ms after the worker returned it.

Objects of at least ``FetchConfig.large_object_size`` are read with parallel
ranged GETs (``storage.ranges.fetch_ranges``, as checkpoint loads) into one
buffer and checked against the object's CRC32C as a whole: a range is only
checked for its length on the way in. GCS serves ranges of an object with
``Range`` requests (https://cloud.google.com/storage/docs/json_api/v1/objects/get,
https://cloud.google.com/storage/docs/sliced-object-downloads).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # registers the shared-memory storages of _new_shared
from torch.utils.data import get_worker_info

from torchbucket.datasets._shm import new_shared
from torchbucket.datasets.config import FetchConfig
from torchbucket.errors import IntegrityError
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.crc32c import Crc32c
from torchbucket.storage.listed import as_listed, check_listed_size, read_verified
from torchbucket.storage.ranges import fetch_ranges

__all__ = [
    "Sample",
    "SharedComposite",
    "SharedSlab",
    "collate_list",
    "new_tensor",
    "object_gets",
    "read_object",
    "to_output",
]

logger = logging.getLogger(__name__)

Sample = bytes | torch.Tensor

#: Whole-object reads of a large object before a CRC32C mismatch is reported.
_ATTEMPTS = 2


def collate_list(batch: Sequence[Any]) -> list[Any]:
    """A DataLoader ``collate_fn`` that keeps a batch as the list of its samples.

    For samples of different sizes (``default_collate`` stacks tensors, which
    needs one shape). Tensors in the list still pass from a worker to the main
    process by handle.
    """
    return list(batch)


def new_tensor(size: int) -> torch.Tensor:
    """A 1-D ``torch.uint8`` tensor of ``size`` bytes, not yet written.

    On shared memory in a DataLoader worker (so it is handed over by handle),
    carved from a segment the main process has let go of where the worker
    reuses them (``_shm``); ordinary memory in any other process, where
    nothing is handed over.
    """
    if size == 0 or get_worker_info() is None:
        return torch.empty(size, dtype=torch.uint8)
    return new_shared(size)


class SharedComposite:
    """A composite received into one tensor, its objects handed out as views of it.

    The ``receive_into`` of ``fetch_group`` for ``FetchConfig(output="tensor")``:
    the socket writes the composite into one :func:`new_tensor` (shared memory
    in a DataLoader worker), and each object is a slice of it. Torch's
    multiprocessing pickler sends views of one storage with one handle, so a
    batch costs a handle per composite it draws from, where a fresh tensor per
    object cost a handle (and a shared-memory segment) per object, and the
    ``bytes`` output a copy of every byte through the worker's pipe. A view
    keeps its whole composite's memory alive until it is dropped.
    """

    __slots__ = ("_tensor",)

    def __init__(self, size: int) -> None:
        self._tensor = new_tensor(size)

    @property
    def view(self) -> memoryview:
        """The tensor's bytes, written by the read of the composite."""
        return self._tensor.numpy().data

    def piece(self, start: int, stop: int) -> torch.Tensor:
        """The object at ``[start, stop)``: a view, no copy."""
        return self._tensor[start:stop]


class SharedSlab:
    """Tensors for objects read one by one, carved in order out of shared segments.

    In a DataLoader worker each segment is :func:`new_tensor` shared memory of
    ``slab_bytes``, and an object's tensor is a view of it at a 64-byte
    aligned offset; an object larger than :attr:`MOST` gets a segment of its
    own. Consecutive objects (a batch, a window's next ones) so share a
    handle when handed to the main process, where one segment per object cost
    a handle each (see the module). A view keeps its whole segment alive until
    it is dropped, as a composite's pieces do. Outside a worker, where nothing
    is handed over, every object gets its own tensor.

    Args:
        slab_bytes: Size of each segment, bytes (see :meth:`fitting`).
    """

    __slots__ = ("_off", "_slab", "_slab_bytes")

    #: Offsets of the objects in a segment are multiples of this.
    ALIGN = 64
    #: Objects larger than this are not carved. At 1 MiB, carving (4 to a
    #: segment of the window's 4 MiB) took the defaults' client CPU from
    #: 1.39-1.49 to 1.30-1.42 ms/MiB (issue 43); a view holds its segment,
    #: so the segment, not the object, is what a kept sample pins.
    MOST = 2 << 20

    def __init__(self, slab_bytes: int) -> None:
        self._slab_bytes = slab_bytes
        self._slab: torch.Tensor | None = None
        self._off = 0

    @classmethod
    def fitting(cls, sizes: Sequence[int]) -> SharedSlab | None:
        """A slab that holds exactly the carved objects of these sizes, or ``None``."""
        total = sum(cls._aligned(n) for n in sizes if 0 < n <= cls.MOST)
        return cls(total) if total else None

    @classmethod
    def _aligned(cls, size: int) -> int:
        return -(-size // cls.ALIGN) * cls.ALIGN

    def tensor(self, size: int) -> torch.Tensor:
        """A 1-D ``torch.uint8`` tensor of ``size`` bytes, not yet written."""
        if size == 0 or size > self.MOST or get_worker_info() is None:
            return new_tensor(size)
        slab = self._slab
        if slab is None or self._off + size > slab.numel():
            slab = self._slab = new_tensor(max(self._slab_bytes, size))
            self._off = 0
        start = self._off
        self._off = self._aligned(start + size)
        return slab[start : start + size]


def to_output(
    data: bytes | torch.Tensor, fetch: FetchConfig, slab: SharedSlab | None = None
) -> Sample:
    """``data`` as ``fetch.output`` asks (a piece of a composite, a decoded gzip object).

    A tensor (a view of a :class:`SharedComposite`) is already what ``"tensor"``
    asks; bytes are copied into a tensor, carved from ``slab`` if given.
    """
    if fetch.output == "bytes" or isinstance(data, torch.Tensor):
        return data
    tensor = slab.tensor(len(data)) if slab is not None else new_tensor(len(data))
    if data:
        tensor.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return tensor


def object_gets(size: int, fetch: FetchConfig) -> int:
    """The GETs :func:`read_object` makes of an object of ``size`` bytes (not gzip).

    One; or, from ``fetch.large_object_size`` on, one per ``fetch.range_size``.
    """
    if size >= fetch.large_object_size and size > fetch.range_size:
        return math.ceil(size / fetch.range_size)
    return 1


async def read_object(
    store: ObjectStore, info: ObjectInfo, fetch: FetchConfig, slab: SharedSlab | None = None
) -> Sample:
    """Read one object as listed (its generation, its size), as ``fetch.output`` asks.

    With ``"tensor"``, the object's tensor is carved from ``slab`` if given.

    Raises:
        NotFoundError: The object is gone, or was rewritten since it was listed.
        IntegrityError: It is not the size it was listed with, or its bytes do
            not match its CRC32C (twice).
    """
    ranged = object_gets(info.size, fetch) > 1
    if info.transcoded or info.size == 0 or (fetch.output == "bytes" and not ranged):
        # A gzip object's listed size and offsets are its stored bytes': read whole.
        # Not carved: a gzip object decodes to more bytes than it was listed
        # with, which the slab (sized by listed sizes) did not plan for.
        data = await read_verified(store, info)
        return to_output(data, fetch, None if info.transcoded else slab)
    if fetch.output == "tensor":
        tensor = slab.tensor(info.size) if slab is not None else new_tensor(info.size)
        await _receive(store, info, tensor.numpy().data, fetch, ranged)
        return tensor
    buffer = np.empty(info.size, dtype=np.uint8)
    await _receive(store, info, buffer.data, fetch, ranged)
    return buffer.tobytes()


async def _receive(
    store: ObjectStore, info: ObjectInfo, view: memoryview, fetch: FetchConfig, ranged: bool
) -> None:
    uri = store.uri(info.name)
    for attempt in range(1, _ATTEMPTS + 1):
        with as_listed(store, info):
            if ranged:
                ranges = math.ceil(info.size / fetch.range_size)
                await fetch_ranges(
                    store,
                    [(info.name, view, 0)],
                    generation=info.generation,
                    chunk_size=fetch.range_size,
                    parallelism=ranges,
                    operation="get",
                )
            else:
                # One range that is the whole object: the store checks its CRC32C.
                got = await store.get_into(info.name, view, generation=info.generation)
                check_listed_size(store, info, got)
        if not ranged or info.crc32c is None:
            return
        crc = Crc32c()
        crc.update(view)
        if crc.b64() == info.crc32c:
            return
        # A range is checked only for its length on the way in, so which one
        # was damaged is unknown: read them all again.
        message = f"crc32c of the bytes read is {crc.b64()}, the object's is {info.crc32c}"
        if attempt == _ATTEMPTS:
            raise IntegrityError(message, operation="get", uri=uri)
        logger.warning("%s: %s; reading it again", uri, message)
