"""Raw ``bytes`` samples handed from a DataLoader worker to the main process through shared memory.

A ``bytes`` sample that a DataLoader worker returns reaches the main process
pickled through a pipe: the worker's pickler copies it into its message, the
pipe copies it through the kernel in 64 KiB writes, and the main process
reads it into a buffer and copies it again into the ``bytes`` it unpickles.
Every one of those copies lands in memory freshly allocated, and on this
project's 2-core VM a page fault per 4 KiB cost more than the copy itself
(0.47-0.61 ms per MiB for fresh pages against 0.06-0.19 for reused ones,
measured by copying into new ``bytes``).

Where nothing in the worker needs the sample as anything but the raw bytes
(no ``data_format_fn``) and objects are large enough for it to pay
(:data:`SHARED_BYTES_FROM`), a worker instead reads objects as
``FetchConfig(output="tensor", reuse_shared_memory=True)`` does: straight
into shared segments it reuses (``_shm``), and hands each sample out as a
:class:`HandedBytes`, a ``bytes`` (a subclass, so a ``collate_fn`` in the
worker sees ``bytes`` with the object's contents) that pickles as a handle
to the segment. Where the dataset's samples go straight to torch's own
``collate_fn`` (called by torch's fetcher, with nothing of the user's in
between), which returns them as they are, the :class:`HandedBytes` is
empty: its bytes stay in the segment, and the worker copies nothing (that copy into fresh pages
cost about as much as receiving the object: both workers' CPU 0.86-1.18
against 1.41-1.69 ms per MiB at 1 MiB on this project's VM). Unpickling
it in the main process makes a plain ``bytes`` from the segment: one copy, and the batch's message on the pipe is a few
hundred bytes. What the main process gets is exactly what it got before, a
``bytes`` object; so does a ``data_format_fn``, which turns this off (it
runs in the worker, and hands over whatever it returns).

Measured with ``benchmarks/sizes.py`` (an A/B in one run, the defaults
with and without it, ``--only map_default,iter_default,map_default_pipe,iter_default_pipe``,
2 runs each, 2-core VM; docs/benchmarks.md's sizes section), with torch's
own ``collate_fn``, map-style / iterable samples/s: 256 KiB 2,135 / 2,192
through shared memory against 1,623 / 1,633 through the pipe (client CPU
2.6 against 3.4 ms per MiB); 64 KiB (composed) 7,367 / 7,516 against
5,942 / 5,941; 16 KiB 8,757 / 9,271 against 8,742 / 8,802; 4 KiB 12,072 /
12,450 against 12,301 / 12,677 (CPU per MiB 21.1 / 20.7 against 20.4 /
18.7), hence :data:`SHARED_BYTES_FROM`. ``FetchConfig(shared_bytes=False)``
turns it off.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.utils.data import default_collate, default_convert, get_worker_info

from torchbucket.datasets import _heap
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig

__all__ = [
    "SHARED_BYTES_FROM",
    "HandedBytes",
    "Reading",
    "goes_straight_to_torchs_collate",
    "hand_over",
    "reading_config",
]

#: Mean object size from which raw ``bytes`` samples cross through shared memory.
SHARED_BYTES_FROM = 32 << 10


def _to_bytes(storage: torch.UntypedStorage, offset: int, size: int) -> bytes:
    """The main process's side of a :class:`HandedBytes`: a plain ``bytes`` copy of its piece.

    The first in a process lets its allocator keep the pages these copies
    land in (:func:`torchbucket.datasets._heap.settle`).
    """
    _heap.settle()
    return _heap.new_bytes(storage.data_ptr() + offset, size)


class HandedBytes(bytes):
    """A raw sample in a DataLoader worker: ``bytes``, handed over as its piece of a segment.

    The worker's pickler (``ForkingPickler``) sends the segment's storage
    (by handle: the segment pool's, or torch's) with the piece's offset and
    length, and the storage once per batch however many pieces of it the
    batch holds; any other pickler sends the bytes. Where it goes straight
    to torch's own ``collate_fn`` (:func:`goes_straight_to_torchs_collate`),
    it is empty in the worker: nothing there reads it, and its contents are
    the segment's.
    """

    _tensor: torch.Tensor

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return bytes, (self._tensor.numpy().tobytes(),)


def _reduce_handed(handed: HandedBytes) -> tuple[Any, tuple[Any, ...]]:
    tensor = handed._tensor
    # One Python object per storage (torch keeps it while the storage lives),
    # so a batch's pickle holds each segment once.
    return _to_bytes, (tensor.untyped_storage(), tensor.storage_offset(), tensor.numel())


ForkingPickler.register(HandedBytes, _reduce_handed)


#: torch's collate functions that return ``bytes`` samples as they are, the
#: batch a list of them (``default_collate``; ``default_convert`` without batching).
_PASSING_THROUGH = (default_collate, default_convert)
#: The module of torch's dataset fetchers (``_MapDatasetFetcher``,
#: ``_IterableDatasetFetcher``), whose ``fetch`` calls the dataset and then
#: its ``collate_fn`` on what it returned.
_FETCH_MODULE = "torch.utils.data._utils.fetch"


def goes_straight_to_torchs_collate() -> bool:
    """Whether the sample being made goes from this dataset straight to torch's own ``collate_fn``.

    So when nothing in the worker will read it. Called inside the dataset
    (its ``__getitems__``, ``__getitem__`` or iterator's ``__next__``): true
    where the first caller outside torchbucket is torch's fetcher and its
    ``collate_fn`` is ``default_collate`` or ``default_convert``. Anything
    between the two (a dataset of the user's around this one, a
    ``Subset``, a wrapper that times the calls) or a ``collate_fn`` of the
    user's: false, and the sample keeps its bytes. So is any torch whose
    fetcher is not where this looks.
    """
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torchbucket."):
        frame = frame.f_back  # type: ignore[assignment]
    if (
        frame is None
        or frame.f_code.co_name != "fetch"
        or frame.f_globals.get("__name__") != _FETCH_MODULE
    ):
        return False
    collate_fn = getattr(frame.f_locals.get("self"), "collate_fn", None)
    return any(collate_fn is f for f in _PASSING_THROUGH)


def hand_over(sample: Any) -> Any:
    """``sample`` (a tensor read for the hand-over) as a :class:`HandedBytes`; else unchanged.

    Empty where torch's own ``collate_fn`` takes it (nothing in the worker
    reads it: see the module); with the contents otherwise.
    """
    if not isinstance(sample, torch.Tensor):
        return sample
    empty = goes_straight_to_torchs_collate()
    handed = HandedBytes() if empty else HandedBytes(sample.numpy().data)
    # The tensor, not its storage's Python object: that object is one per
    # storage, shared with the segment pool's own, so only a tensor counts in
    # the storage's use count, which tells the pool the segment is still held
    # (holding the storage object instead let a segment be reused before the
    # main process had read it: CRC32C mismatches in benchmarks/sizes.py).
    handed._tensor = sample
    return handed


def reading_config(fetch: FetchConfig, data_format_fn: Any, catalog: Catalog) -> FetchConfig:
    """The config this process reads with: ``fetch``, or the hand-over's (see the module).

    The hand-over's (tensor output into reused segments) where all hold: a
    DataLoader worker, ``bytes`` output with ``fetch.shared_bytes``, no
    ``data_format_fn``, and objects of :data:`SHARED_BYTES_FROM` or more on
    average. The caller compares the result with ``fetch`` by identity to know.
    """
    if (
        fetch.output != "bytes"
        or not fetch.shared_bytes
        or data_format_fn is not None
        or get_worker_info() is None
        or len(catalog) == 0
        or float(catalog.sizes.mean()) < SHARED_BYTES_FROM
    ):
        return fetch
    return dataclasses.replace(fetch, output="tensor", reuse_shared_memory=True)


class Reading:
    """A dataset's :func:`reading_config`, decided once in each process that reads.

    Args:
        fetch: The dataset's config.
        data_format_fn: The dataset's ``data_format_fn``.
        catalog: The dataset's objects.
    """

    def __init__(self, fetch: FetchConfig, data_format_fn: Any, catalog: Catalog) -> None:
        self._fetch = fetch
        self._format = data_format_fn
        self._catalog = catalog
        self._pid = 0
        self._config = fetch

    def config(self) -> FetchConfig:
        """The config to read with in this process."""
        pid = os.getpid()
        if self._pid != pid:
            self._config = reading_config(self._fetch, self._format, self._catalog)
            self._pid = pid
        return self._config

    def handing(self) -> bool:
        """Whether raw samples read here go out as :class:`HandedBytes`."""
        return self.config() is not self._fetch
