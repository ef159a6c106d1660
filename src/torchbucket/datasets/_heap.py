"""Where the main process's ``bytes`` of handed-over samples are made: pages it keeps.

Unpickling a :class:`~torchbucket.datasets._handover.HandedBytes` makes a
plain ``bytes`` in the main process and copies the sample into it from
shared memory. The copy is cheap; the pages under it were not. glibc's
``malloc`` serves a block of 128 KiB and more from a mapping of its own
until one such block is freed, then from its heap, and gives the top of its
heap back to the kernel (``brk``) whenever the free space there reaches
twice the largest block freed so far (``M_TRIM_THRESHOLD``'s dynamic
default). A batch of 64 samples of 1 MiB, freed once the next one is
made, is 64 MiB at the heap's top: given back, so the batch after it
faults every page in again, 4 KiB at a time, and a block over 32 MiB is a
new mapping every time. On this project's AMD EPYC VM a fault costs 3-5
microseconds: copying batches of 64 MiB (a microbenchmark of this
pattern) took 0.43 ms per MiB at 1 MiB and 0.45 at 16 MiB, with half the
pages or more faulting, against 0.13-0.14 ms with the settings below.

So the first hand-over in a process (:func:`settle`) sets, where the
process runs glibc's allocator and neither the environment nor a preloaded
allocator says otherwise:

- ``M_MMAP_THRESHOLD`` to 32 MiB, the ceiling glibc's own dynamic threshold
  rises to (setting either value by ``mallopt`` turns the dynamic one off);
- ``M_TRIM_THRESHOLD`` to :data:`KEEP_FREE`: up to that much free memory
  at the heap's top stays mapped for the next batches.

A process that sets ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TOP_PAD_`` or a ``glibc.malloc`` tunable (``GLIBC_TUNABLES``), or
preloads another allocator (``LD_PRELOAD`` naming one: jemalloc, tcmalloc,
mimalloc), keeps its own. ``FetchConfig(shared_bytes=False)`` turns the
hand-over off and this with it in the main process. A process forked after
(the DataLoader workers of later epochs) inherits the settings with the
rest of its parent's allocator, and every DataLoader worker settles as it
starts (:mod:`torchbucket.datasets.workers`): its shared segments are not
on its heap, but the network's receive buffers are.

A sample over 32 MiB still gets a mapping of its own (glibc's ceiling): its
``bytes`` is made uninitialised (``PyBytes_FromStringAndSize(NULL, n)``, as
C code makes one to fill), its 2 MiB-aligned inside advised as
transparent huge pages (``MADV_HUGEPAGE``, a hint the kernel may ignore),
then filled: 64 MiB copied in 0.19 ms per MiB against 0.74 through 4 KiB
pages in the same microbenchmark.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

from torchbucket._madvise import MADV_HUGEPAGE, madvise

__all__ = ["KEEP_FREE", "MMAP_FROM", "new_bytes", "settle"]

logger = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameters (``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Free memory at the heap's top a process that receives handed-over samples keeps mapped.
KEEP_FREE = 256 << 20
#: glibc's ceiling for its mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``).
MMAP_FROM = 32 << 20
#: Environment variables with which the user tunes glibc's allocator.
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
#: Allocators a process may preload instead of glibc's.
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_HUGE_PAGE = 2 << 20

_settled = False


def _glibc() -> bool:
    """Whether this process runs glibc (a C library without the name, musl, has no such value)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


def _users_own(environ: Mapping[str, str]) -> str | None:
    """What in ``environ`` says the process's allocator is the user's to tune, if anything."""
    for name in _USER_SETTINGS:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    preload = environ.get("LD_PRELOAD", "").lower()
    if any(name in preload for name in _OTHER_ALLOCATORS):
        return "LD_PRELOAD"
    return None


def settle() -> None:
    """Set this process's allocator to keep its freed pages (see the module), once."""
    global _settled
    if _settled:
        return
    _settled = True
    if not sys.platform.startswith("linux") or not _glibc():
        return
    own = _users_own(os.environ)
    if own is not None:
        logger.debug("torchbucket leaves malloc as %s sets it", own)
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    set_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_FROM)
    set_trim = mallopt(_M_TRIM_THRESHOLD, KEEP_FREE)
    logger.debug(
        "malloc: mmap threshold %d MiB (%s), trim threshold %d MiB (%s)",
        MMAP_FROM >> 20,
        "set" if set_mmap else "refused",
        KEEP_FREE >> 20,
        "set" if set_trim else "refused",
    )


_uninitialised = ctypes.pythonapi.PyBytes_FromStringAndSize
_uninitialised.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_uninitialised.restype = ctypes.py_object


def new_bytes(address: int, size: int) -> bytes:
    """A ``bytes`` copy of ``size`` bytes at ``address``; over :data:`MMAP_FROM`, on huge pages where it can."""
    if size <= MMAP_FROM or madvise is None:
        return ctypes.string_at(address, size)
    out: bytes = _uninitialised(None, size)
    start = ctypes.cast(ctypes.c_char_p(out), ctypes.c_void_p).value
    if start is None:  # not a pointer ctypes gives for a bytes object; the plain copy then
        return ctypes.string_at(address, size)
    first = -(-start // _HUGE_PAGE) * _HUGE_PAGE
    end = (start + size) // _HUGE_PAGE * _HUGE_PAGE
    if end > first:
        madvise(first, end - first, MADV_HUGEPAGE)  # a hint: a refusal leaves 4 KiB pages
    ctypes.memmove(start, address, size)
    return out
