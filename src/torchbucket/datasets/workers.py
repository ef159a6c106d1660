"""What a DataLoader worker does once, before its first read: its allocator, its collector.

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

Before that, a worker sets its allocator to keep freed pages
(:func:`torchbucket.datasets._heap.settle`, which leaves a user's own
malloc settings alone). The workers of a second epoch inherited it from
the main process, which settles at its first hand-over; those of the
first epoch, forked before it, ran on glibc's defaults and faulted about
twice the pages (the network's receive buffers, freed at the heap's top
and given back): measured in one script, four epochs of 128 x 16 MiB and
of 2,000 x 1 MiB (``BucketIterableDataset``, 2 workers, the emulator's
same-region model), 180,000-250,000 minor faults a worker in the first
epoch against 80,000-116,000 in the later ones, and 1.08-1.16 against
0.80-0.88 s of CPU; with the main process settled before its first epoch,
the first epoch's workers were as the later ones. (``benchmarks/sizes.py``,
whose runs are one epoch each in processes forked from a zygote, showed no
difference at 1 and 16 MiB.) A worker that settles keeps up to
``_heap.KEEP_FREE`` of freed memory, as those of later epochs always did.
"""

from __future__ import annotations

import gc
import os

from torch.utils.data import get_worker_info

from torchbucket.datasets import _heap

__all__ = ["settle_worker"]

_frozen_in: int | None = None  # the pid that froze; a fork's child has another


def settle_worker(freeze_gc: bool) -> None:
    """In a DataLoader worker, the first call settles its allocator and freezes the collector.

    See the module; ``freeze_gc=False`` leaves the collector alone.
    """
    global _frozen_in
    if get_worker_info() is None:
        return
    _heap.settle()
    if not freeze_gc:
        return
    pid = os.getpid()
    if _frozen_in != pid:
        gc.freeze()
        _frozen_in = pid
