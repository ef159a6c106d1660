"""What a DataLoader worker does once, before its first read: freeze the collector.

A worker forked from a training process inherits every object the parent had
(torch's modules, the model, the dataset): importing torch and torchbucket
alone makes about 170,000 objects the collector tracks.
CPython's full (generation 2) collection walks all of them, and it runs on
the worker's allocation count: measured on this project's 2-core VM, three
such collections per worker in a one-epoch map-style run (10,000 x 100 KiB),
100-118 ms each, during which the worker holds the GIL and its reads in
flight wait for their answers to be taken. That is what sets the p99 of a
map-style batch's fetch. ``gc.freeze()`` moves the inherited objects to the
collector's permanent generation, so later collections scan only what the
worker made since: 2-4 ms each, measured the same way. The Python docs
recommend it for processes that fork without exec
(https://docs.python.org/3/library/gc.html#gc.freeze); it also keeps the
collector from writing to the inherited pages (copy-on-write).

The cost: a reference cycle among objects inherited from the parent that is
garbage at the worker's first read is never collected in that worker. Only
DataLoader workers are frozen, never the main process; ``FetchConfig(
freeze_gc=False)`` (``ShardReadConfig(freeze_gc=False)`` for the shard
datasets) leaves them alone too.
"""

from __future__ import annotations

import gc
import os

from torch.utils.data import get_worker_info

__all__ = ["settle_worker"]

_frozen_in: int | None = None  # the pid that froze; a fork's child has another


def settle_worker(freeze_gc: bool) -> None:
    """In a DataLoader worker, the first call freezes the collector (see the module)."""
    global _frozen_in
    if not freeze_gc or get_worker_info() is None:
        return
    pid = os.getpid()
    if _frozen_in != pid:
        gc.freeze()
        _frozen_in = pid
