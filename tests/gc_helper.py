"""The collector's frozen count as a DataLoader worker's first read saw it.

``gc.get_freeze_count()`` walks the whole permanent generation: in a worker
forked from a pytest process that has imported the suite, over a million
objects, milliseconds per call. Asked for every sample, that was 4-8 CPU
seconds per test. The freeze tests need the count at each worker's first read
(a later freeze could not change it), so it is taken once per process.
"""

from __future__ import annotations

import gc
import os

_first: dict[int, int] = {}


def frozen_at_first_call() -> tuple[int, int]:
    """``(pid, frozen count)``, the count taken at this process's first call."""
    pid = os.getpid()
    if pid not in _first:
        _first[pid] = gc.get_freeze_count()
    return pid, _first[pid]
