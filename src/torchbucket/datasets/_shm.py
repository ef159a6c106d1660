"""Shared-memory segments a DataLoader worker reuses once every reader has let go of them.

With ``FetchConfig(output="tensor")`` a worker receives objects into tensors
on shared memory, so the DataLoader hands them to the main process by handle
(see ``_receive``). Making a fresh segment for every composite cost, per
100 KiB object, about a fifth of a worker's CPU: ``shm_open``, ``ftruncate``,
``mmap``, and the kernel zeroing and mapping every page of it. torch's default
sharing strategy on Linux, ``file_descriptor``, also makes each segment a
connection from the main process to the worker's ``resource_sharer`` thread
(an authentication handshake, then the descriptor) when a batch is unpickled.

With ``FetchConfig(reuse_shared_memory=True)`` a worker keeps its segments
and hands them over its own way, and knows when a segment is free again:

- A segment is a ``memfd`` (``memfd_create(2)``): no name anywhere, its
  memory goes with the last process that maps it or holds a descriptor of
  it. It starts with a 64-byte header (a random token, and the number of
  handles to it readers have opened); tensors are views after it.
- The worker's pickler (``ForkingPickler``, in the worker only) sends a
  pooled segment as a handle: the worker's pid, its descriptor's number, the
  token and the size, and counts the handles it sent. Any other storage goes
  torch's way (:func:`torch.multiprocessing.reductions.reduce_storage`).
- The reader (the main process, or any process that unpickles the handle)
  opens ``/proc/<pid>/fd/<n>``, which gives it an open file description of
  its own, takes a shared OFD lock on it (``F_OFD_SETLK``), maps it, checks
  the token, and adds one to the header's count of opened handles (a count,
  not the latest number seen: a lost update between two readers leaves the
  segment busy for good, never free too early). An OFD lock lasts as long as its file description: every
  descriptor and every mapping of it, in every process it reaches (torch
  passes received storages on by descriptor, and a ``fork`` inherits them).
  A handle is opened once per reader and storage; a second one for a storage
  the reader still has is answered from a cache of weak references, as
  torch's own ``rebuild_storage_fd`` does.
- The segment is free when, in the worker, nothing but the pool holds it
  (torch's use count of the storage), every handle sent has been opened
  (the header's count equals the pool's), and no reader's lock remains
  (``F_OFD_GETLK`` for an exclusive lock on the worker's descriptor finds no
  conflict). Then the next tensor of a size it fits is carved from it, its
  pages already mapped.

Nothing is left behind when an epoch is stopped early or a worker is killed:
an unread handle is only numbers, and the segment's memory goes with the
processes. Nothing is started either (torch's ``file_system`` strategy,
which an earlier version of this pool used for its count of mapping
processes, starts a ``torch_shm_manager`` per worker: 0.17 s of CPU, as it
loads ``libtorch_cpu``). What it needs: Linux 3.17 or later (``memfd``, OFD
locks), ``/proc``, and a reader allowed to open the worker's descriptors
there (the same user, as DataLoader workers are; ``ptrace`` read access).
The worker checks what it can of this as it starts (:func:`_self_test`) and
keeps torch's way and fresh segments where it cannot, and says so at INFO.
A reader that cannot open a handle raises an error that names the setting.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import secrets
import struct
import threading
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing.reductions as torch_reductions
from torch.utils.data import get_worker_info

from torchbucket._madvise import MADV_POPULATE_WRITE, madvise

__all__ = ["SegmentPool", "enable", "new_shared", "pool", "prefault"]

logger = logging.getLogger(__name__)

#: Bytes before a segment's data: the token (u64) and the handles opened (u64).
_HEADER = 64
_TOKEN_AT = 0
_OPENED_AT = 8
#: Segments are made in steps of a power of two between an eighth and a quarter
#: of their size (at least 64 KiB), so composites of nearly equal sizes fit each
#: other's segments.
_STEP_LEAST = 64 << 10
#: Free segments kept for reuse, bytes per worker; more are let go.
IDLE_BYTES_MOST = 64 << 20
#: Segments the pool tracks (a descriptor each); past this the oldest that
#: only readers hold (no handle in flight, no view in the worker) are forgotten.
TRACKED_MOST = 256

# struct flock (fcntl(2)) on Linux: l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = "hh4xqqi4x"
_SHARED_LOCK = struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0)
_EXCLUSIVE_PROBE = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)

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


def _word(address: int) -> ctypes.c_uint64:
    return ctypes.c_uint64.from_address(address)


def _locked_by_others(fd: int) -> bool:
    """Whether an open file description other than ``fd``'s holds a lock on its file."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _EXCLUSIVE_PROBE)
    kind: int = struct.unpack(_FLOCK, answer)[0]
    return kind != fcntl.F_UNLCK


class _Segment:
    __slots__ = ("base", "fd", "sent", "tensor", "token")

    def __init__(self, capacity: int) -> None:
        fd = os.memfd_create("torchbucket-segment", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _HEADER + capacity)
            storage = torch.UntypedStorage._new_shared_fd_cpu(fd, _HEADER + capacity)  # type: ignore[attr-defined]
        finally:
            os.close(fd)  # the storage keeps a duplicate: the same file description
        #: The storage's own descriptor, what handles name and locks are probed on.
        self.fd: int = storage._share_fd_cpu_()[0]  # type: ignore[attr-defined]
        self.tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
        prefault(self.tensor)
        self.base = self.tensor.data_ptr()
        self.token = secrets.randbits(63) | 1
        _word(self.base + _TOKEN_AT).value = self.token
        #: Handles pickled; the header counts those a reader opened.
        self.sent = 0

    @property
    def capacity(self) -> int:
        return self.tensor.numel() - _HEADER

    def in_flight(self) -> bool:
        return _word(self.base + _OPENED_AT).value != self.sent


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
        self._segments: list[_Segment] = []  # oldest first
        self._by_base: dict[int, _Segment] = {}
        self._lock = threading.Lock()
        self._use_count: Callable[[int], int] = torch._C._storage_Use_Count
        #: Segments made, and tensors carved from a reused one (for tests, the timeline).
        self.made = 0
        self.reused = 0

    def _held_here(self, segment: _Segment) -> bool:
        storage = segment.tensor.untyped_storage()
        # Two holders in this process when it holds no view: the pool's tensor
        # and the ``storage`` object just made.
        return self._use_count(storage._cdata) > 2

    def _free(self, segment: _Segment) -> bool:
        if self._held_here(segment) or segment.in_flight():
            return False
        return not _locked_by_others(segment.fd)

    def tensor(self, size: int) -> torch.Tensor:
        """A 1-D ``torch.uint8`` tensor of ``size`` bytes on shared memory, not yet written.

        A view of a free segment that fits (at most twice ``size``), else of a
        new one. Its bytes are whatever the segment held before.
        """
        with self._lock:
            for segment in self._segments:
                if size <= segment.capacity <= 2 * size and self._free(segment):
                    self.reused += 1
                    return segment.tensor[_HEADER : _HEADER + size]
            segment = _Segment(_capacity(size))
            self.made += 1
            self._trim()
            self._segments.append(segment)
            self._by_base[segment.base] = segment
            return segment.tensor[_HEADER : _HEADER + size]

    def _trim(self) -> None:
        idle = 0
        kept: list[_Segment] = []
        for segment in reversed(self._segments):  # newest first: let the oldest free go
            if self._free(segment):
                idle += segment.capacity
                if idle > self._idle_most:
                    continue
            kept.append(segment)
        kept.reverse()
        over = len(kept) + 1 - self._tracked_most
        if over > 0:
            # Forget the oldest that only readers hold: every handle opened and
            # no view left here. One this worker still holds (a batch being
            # read, not yet sent) keeps its descriptor open either way; forgotten,
            # it would go torch's way when sent, and its memory not come back.
            forget = [s for s in kept if not s.in_flight() and not self._held_here(s)][:over]
            kept = [s for s in kept if s not in forget]
        self._segments = kept
        self._by_base = {s.base: s for s in kept}

    def handle(self, storage: torch.UntypedStorage) -> tuple[int, int, int, int] | None:
        """What a reader needs to open ``storage``, if it is one of the pool's segments.

        Counted as sent: the segment is busy until a reader has opened it.
        """
        with self._lock:
            segment = self._by_base.get(storage.data_ptr())
            if segment is None:
                return None
            segment.sent += 1
            return (os.getpid(), segment.fd, segment.token, segment.tensor.numel())

    def tracked(self) -> int:
        """Segments tracked now, free or in use."""
        return len(self._segments)


#: Storages opened from handles in this process, by (pid, descriptor, token).
_opened: dict[tuple[int, int, int], torch_reductions.StorageWeakRef] = {}
_opened_lock = threading.Lock()


def _open(pid: int, fd: int, token: int, nbytes: int) -> torch.UntypedStorage:
    """Rebuild a pooled segment sent by a worker (the reader's side of a handle).

    Every handle is opened once, and counted in the segment's header.
    """
    key = (pid, fd, token)
    with _opened_lock:
        ref = _opened.get(key)
        storage = None
        if ref is not None:
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)  # type: ignore[attr-defined]
        if storage is None:
            storage = _open_new(pid, fd, token, nbytes)
            if len(_opened) >= 256:
                for stale in [k for k, r in _opened.items() if r.expired()]:  # type: ignore[no-untyped-call]
                    del _opened[stale]
            _opened[key] = torch_reductions.StorageWeakRef(storage)  # type: ignore[no-untyped-call]
        _word(storage.data_ptr() + _OPENED_AT).value += 1
    return storage


def _open_new(pid: int, fd: int, token: int, nbytes: int) -> torch.UntypedStorage:
    path = f"/proc/{pid}/fd/{fd}"
    try:
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise RuntimeError(
            f"cannot open the shared-memory segment a DataLoader worker sent ({path}: "
            f"{exc.strerror}): the worker has exited, or this process may not open its "
            "descriptors through /proc; read with FetchConfig(reuse_shared_memory=False)"
        ) from exc
    try:
        fcntl.fcntl(own, fcntl.F_OFD_SETLK, _SHARED_LOCK)  # before anything is read
        storage: torch.UntypedStorage = torch.UntypedStorage._new_shared_fd_cpu(own, nbytes)  # type: ignore[attr-defined]
    finally:
        os.close(own)
    if _word(storage.data_ptr() + _TOKEN_AT).value != token:
        raise RuntimeError(
            f"{path} is not the shared-memory segment the DataLoader worker sent "
            "(the worker closed it or exited before this batch was read)"
        )
    return storage


def _reduce_storage_with(
    current: SegmentPool | None, storage: torch.UntypedStorage
) -> tuple[Any, tuple[Any, ...]]:
    if current is not None:
        handle = current.handle(storage)
        if handle is not None:
            return _open, handle
    return torch_reductions.reduce_storage(storage)  # type: ignore[no-untyped-call,no-any-return]


def _reduce_storage(storage: torch.UntypedStorage) -> tuple[Any, tuple[Any, ...]]:
    """The worker's pickler for storages: its pool's segments by handle, others torch's way."""
    return _reduce_storage_with(pool(), storage)


def _self_test() -> str | None:
    """Why segments cannot be handed over and tracked here, or ``None`` when they can."""
    if not hasattr(torch._C, "_storage_Use_Count"):
        return "torch._C._storage_Use_Count is missing"
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_OFD_GETLK"):
        return "no memfd_create or OFD locks on this platform"
    segment = _Segment(_STEP_LEAST)
    try:
        storage = _open_new(os.getpid(), segment.fd, segment.token, segment.tensor.numel())
    except (OSError, RuntimeError) as exc:
        return f"a segment could not be opened through /proc ({exc})"
    held = _locked_by_others(segment.fd)
    del storage
    if not held or _locked_by_others(segment.fd):
        return "an OFD lock was not seen while held, or outlived its file description"
    # A reader may open another process's descriptors only if that process is
    # "dumpable" (ptrace's read check; prctl(2), PR_GET_DUMPABLE).
    if _dumpable() in (0, 2):
        return "this process is not dumpable, so no other may open its descriptors"
    with contextlib.suppress(OSError):
        # The reader is the parent: may this process's user read its descriptors?
        os.listdir(f"/proc/{os.getppid()}/fd")
        return None
    return f"the descriptors of process {os.getppid()} cannot be read through /proc"


def _dumpable() -> int:
    """prctl(PR_GET_DUMPABLE): 1 where other processes of the user may open our descriptors."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return -1
    value: int = prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    return value


_pool: SegmentPool | None = None
_decided_in: int | None = None  # the pid that decided; a fork's child decides again


def enable() -> None:
    """In this DataLoader worker, reuse segments and hand them over by handle.

    Decided once per process, and only in a DataLoader worker; see the module.
    A no-op where :func:`_self_test` finds what it needs missing.
    """
    global _pool, _decided_in
    pid = os.getpid()
    if _decided_in == pid or get_worker_info() is None:
        return
    _decided_in = pid
    _pool = None
    try:
        why = _self_test()
    except (RuntimeError, OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        logger.info("shared memory is not reused (%s); segments are made fresh", why)
        return
    _pool = SegmentPool()
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)


def pool() -> SegmentPool | None:
    """This process's pool, if :func:`enable` made one here."""
    return _pool if _decided_in == os.getpid() else None


def new_shared(size: int) -> torch.Tensor:
    """A 1-D ``torch.uint8`` tensor of ``size`` bytes on shared memory: pooled if enabled."""
    current = pool()
    if current is None:
        return _fresh(size)
    return current.tensor(size)
