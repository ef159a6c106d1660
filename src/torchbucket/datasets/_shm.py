"""Shared-memory segments a DataLoader worker reuses once the main process has let go of them.

With ``FetchConfig(output="tensor")`` a worker receives objects into tensors
on shared memory, so the DataLoader hands them to the main process by handle
(see ``_receive``). Making a fresh segment for every composite cost, per
100 KiB object, about a fifth of a worker's CPU: ``shm_open``, ``ftruncate``,
``mmap``, and the kernel zeroing and mapping every page of it. torch's default
sharing strategy on Linux, ``file_descriptor``, also makes each segment a
connection from the main process to the worker's ``resource_sharer`` thread
(an authentication handshake, then the descriptor) when a batch is unpickled.

Under the ``file_system`` strategy a segment is named, and torch keeps a count
of the processes that map it in the segment itself
(``RefcountedMapAllocator``: an ``int`` in the 64 bytes before the data). The
pickler adds one before a handle leaves the worker and the main process takes
it back once it has mapped the segment, so the count is 1 exactly when only
the worker maps it: every tensor the main process had from it is gone, and no
handle to it is in flight. When, in the worker as well, nothing but the pool
holds it (torch's use count of the storage is 1), the segment is free: the
next tensor of a size it fits is carved from it, its pages already mapped.
Measured in one process of DataLoader(num_workers=2) over the emulator, 10,000
x 100 KiB composed, ``output="tensor"``: client CPU 0.49 -> 0.35 ms per object
(main process 0.08 -> 0.045, workers 0.40 -> 0.30), 25-50 segments made per
worker and epoch instead of ~157.

So in a worker whose dataset asks for tensors with ``FetchConfig(
reuse_shared_memory=True)``, :func:`enable` switches that worker's sharing
strategy to ``file_system`` (torch's docs:
https://pytorch.org/docs/stable/multiprocessing.html#sharing-strategies), which
then applies to every tensor the worker hands over, the collate's too. What
that changes: a segment has a name in ``/dev/shm`` while it is in use, and the
main process holds no file descriptor per tensor. At the worker's exit the
pool counts the worker out of its segments (:meth:`SegmentPool.release`), so
a segment's name goes with the last process that maps it. What it cannot do
is count down a handle that was sent and never read: when an epoch is stopped
early the DataLoader closes its workers' queue unread, with up to
``prefetch_factor`` batches per worker in it, and those segments keep their
names until torch's ``torch_shm_manager`` removes them as the training process
exits (a killed worker's too). That is why it is off by default. The main
process's own strategy is left alone. Before switching, the pool checks on a
segment that the count sits where it reads it (one, two after
``_shared_incref``, one again after ``_shared_decref``); on a torch where it
does not, the worker keeps ``file_descriptor`` and fresh segments, and says so
at INFO.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import multiprocessing.util
import os
import threading
from collections.abc import Callable

import torch
import torch.multiprocessing
from torch.utils.data import get_worker_info

from torchbucket._madvise import MADV_POPULATE_WRITE, madvise

try:
    import _posixshmem  # what multiprocessing.shared_memory unlinks names with
except ImportError:  # pragma: no cover - not on Windows, where this pool is never made
    _posixshmem = None

__all__ = ["SegmentPool", "enable", "new_shared", "pool", "prefault"]

logger = logging.getLogger(__name__)

#: Where RefcountedMapAllocator keeps its count: this many bytes before the data.
_HEADER = 64
#: Segments are made in steps of a power of two between an eighth and a quarter
#: of their size (at least 64 KiB), so composites of nearly equal sizes fit each
#: other's segments.
_STEP_LEAST = 64 << 10
#: Free segments kept for reuse, bytes per worker; more are let go.
IDLE_BYTES_MOST = 64 << 20
#: Segments the pool tracks; past this the oldest in use are forgotten (the
#: main process keeps them alive as long as it holds them).
TRACKED_MOST = 1024

_madvise = madvise


def prefault(tensor: torch.Tensor) -> None:
    """Map a fresh shared tensor's pages in at once, before the socket writes them.

    Only an optimisation: on a kernel without ``MADV_POPULATE_WRITE`` (EINVAL)
    it is turned off for the process, and a failure leaves the pages to fault
    in as they are written.
    """
    global _madvise
    address = tensor.data_ptr()
    if _madvise is None or address % mmap.PAGESIZE:
        return
    failed = _madvise(address, tensor.numel(), MADV_POPULATE_WRITE) != 0
    if failed and ctypes.get_errno() == errno.EINVAL:  # advice unknown to this kernel
        _madvise = None


def _fresh(size: int) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(size)  # type: ignore[no-untyped-call]
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
    prefault(tensor)
    return tensor


def _capacity(size: int) -> int:
    step = max(_STEP_LEAST, 1 << max(0, size.bit_length() - 3))
    return -(-size // step) * step


def _count(segment: torch.Tensor) -> int:
    """The number of processes mapping a ``file_system`` segment (see the module).

    -1 where the data starts less than ``_HEADER`` bytes into its page: the
    count cannot be there, and the page before may not be mapped.
    """
    address = segment.data_ptr()
    if address % mmap.PAGESIZE < _HEADER:
        return -1
    return ctypes.c_int.from_address(address - _HEADER).value


class SegmentPool:
    """Shared segments of one worker, reused once free (see the module).

    Args:
        idle_bytes_most: Free segments kept, bytes; past it the least recently
            made free ones are let go.
        tracked_most: Segments tracked at most.
    """

    def __init__(
        self, idle_bytes_most: int = IDLE_BYTES_MOST, tracked_most: int = TRACKED_MOST
    ) -> None:
        self._idle_most = idle_bytes_most
        self._tracked_most = tracked_most
        self._segments: list[torch.Tensor] = []  # oldest first
        self._lock = threading.Lock()
        self._use_count: Callable[[int], int] = torch._C._storage_Use_Count
        #: Segments made, and tensors carved from a reused one (for tests, the timeline).
        self.made = 0
        self.reused = 0

    def _free(self, segment: torch.Tensor) -> bool:
        storage = segment.untyped_storage()
        # Two holders in this process when free: the pool's tensor and the
        # ``storage`` object just made.
        return self._use_count(storage._cdata) <= 2 and _count(segment) == 1

    def tensor(self, size: int) -> torch.Tensor:
        """A 1-D ``torch.uint8`` tensor of ``size`` bytes on shared memory, not yet written.

        A view of a free segment that fits (at most twice ``size``), else of a
        new one. Its bytes are whatever the segment held before.
        """
        with self._lock:
            for segment in self._segments:
                if size <= segment.numel() <= 2 * size and self._free(segment):
                    self.reused += 1
                    return segment[:size]
            segment = _fresh(_capacity(size))
            self.made += 1
            self._trim()
            self._segments.append(segment)
            return segment[:size]

    def _trim(self) -> None:
        idle = 0
        kept: list[torch.Tensor] = []
        for segment in reversed(self._segments):  # newest first: let the oldest free go
            if self._free(segment):
                idle += segment.numel()
                if idle > self._idle_most:
                    continue
            kept.append(segment)
        kept.reverse()
        del kept[: max(0, len(kept) + 1 - self._tracked_most)]
        self._segments = kept

    def release(self) -> None:
        """Let go of every segment, counting the worker out of each (at its exit).

        A DataLoader worker ends with ``os._exit``, which frees no tensor, so
        without this every segment would keep the worker's count, and its name
        in ``/dev/shm``, until torch's manager removed it as the training
        process ends. A segment nothing else in the worker holds is freed here
        (torch counts it down and removes its name at zero). One still held
        (a window's objects not handed out) is counted down by hand, and its
        name removed when that leaves nobody: no handle to it can still be
        read, as the main process stops reading a worker before it ends it.
        """
        with self._lock:
            segments, self._segments = self._segments, []
        while segments:
            segment = segments.pop()
            storage = segment.untyped_storage()
            del segment
            if self._use_count(storage._cdata) <= 1:
                continue  # the last reference: freed as ``storage`` goes
            name = storage._share_filename_cpu_()[1].decode()  # type: ignore[no-untyped-call]
            storage._shared_decref()  # type: ignore[no-untyped-call]
            tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
            if _count(tensor) == 0 and _posixshmem is not None:
                with contextlib.suppress(OSError):
                    _posixshmem.shm_unlink(name)

    def tracked(self) -> int:
        """Segments tracked now, free or in use."""
        return len(self._segments)


def _self_test() -> str | None:
    """Why the count cannot be read where the pool reads it, or ``None`` when it can."""
    if not hasattr(torch._C, "_storage_Use_Count"):
        return "torch._C._storage_Use_Count is missing"
    probe = torch.UntypedStorage._new_shared(_STEP_LEAST)  # type: ignore[no-untyped-call]
    tensor = torch.empty(0, dtype=torch.uint8).set_(probe)
    seen = [_count(tensor)]
    probe._shared_incref()  # type: ignore[no-untyped-call]
    seen.append(_count(tensor))
    probe._shared_decref()  # type: ignore[no-untyped-call]
    seen.append(_count(tensor))
    if seen != [1, 2, 1]:
        return f"the segment's count read {seen}, not [1, 2, 1]"
    return None


_pool: SegmentPool | None = None
_decided_in: int | None = None  # the pid that decided; a fork's child decides again


def enable() -> None:
    """In this DataLoader worker, share tensors by ``file_system`` and reuse segments.

    Decided once per process, and only in a DataLoader worker; see the module. A no-op where torch has no
    ``file_system`` strategy or the count is not where the pool reads it.
    """
    global _pool, _decided_in
    pid = os.getpid()
    if _decided_in == pid or get_worker_info() is None:
        return
    _decided_in = pid
    _pool = None
    mp = torch.multiprocessing
    if "file_system" not in mp.get_all_sharing_strategies():  # type: ignore[no-untyped-call]
        logger.info("shared memory is not reused: torch has no file_system sharing strategy")
        return
    before = mp.get_sharing_strategy()  # type: ignore[no-untyped-call]
    mp.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    try:
        why = _self_test()
    except (RuntimeError, OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        mp.set_sharing_strategy(before)  # type: ignore[no-untyped-call]
        logger.info("shared memory is not reused (%s); segments are made fresh", why)
        return
    _pool = SegmentPool()
    # Run by multiprocessing as the worker's process ends (before os._exit).
    multiprocessing.util.Finalize(None, _pool.release, exitpriority=0)


def pool() -> SegmentPool | None:
    """This process's pool, if :func:`enable` made one here."""
    return _pool if _decided_in == os.getpid() else None


def new_shared(size: int) -> torch.Tensor:
    """A 1-D ``torch.uint8`` tensor of ``size`` bytes on shared memory: pooled if enabled."""
    current = pool()
    if current is None:
        return _fresh(size)
    return current.tensor(size)
