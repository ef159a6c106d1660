"""``madvise(2)`` from the C library, for the few places that manage pages.

Checkpoint loads hand back pages they have consumed (``MADV_DONTNEED``) and
dataset workers map in the pages of a receive buffer at once
(``MADV_POPULATE_WRITE``), and the main process asks for huge pages under a
large sample it copies out of shared memory (``MADV_HUGEPAGE``). Python's
``mmap.madvise`` works only on an ``mmap`` object, and these buffers are
numpy arrays, torch tensors and ``bytes``, so the call goes through ctypes
on an address.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ["MADV_DONTNEED", "MADV_HUGEPAGE", "MADV_POPULATE_WRITE", "madvise"]

#: Drop a private anonymous range's pages (they read as zeros afterwards).
MADV_DONTNEED = 4
#: Back a range with transparent huge pages where the kernel can (a hint).
MADV_HUGEPAGE = 14
#: Map a range's pages in, writable (Linux >= 5.14).
MADV_POPULATE_WRITE = 23


def _load() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


#: ``madvise(address, length, advice) -> 0 or -1``; ``None`` off Linux.
madvise = _load()
