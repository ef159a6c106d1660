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
to the segment. Unpickling it in the main process makes a plain ``bytes``
from the segment: one copy, and the batch's message on the pipe is a few
hundred bytes. What the main process gets is exactly what it got before, a
``bytes`` object; so does a ``data_format_fn``, which turns this off (it
runs in the worker, and hands over whatever it returns).

Measured with ``benchmarks/sizes.py`` (see docs/benchmarks.md's sizes
section). ``FetchConfig(shared_bytes=False)`` turns it off.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch.utils.data import get_worker_info

from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig

__all__ = ["SHARED_BYTES_FROM", "HandedBytes", "Reading", "hand_over", "reading_config"]

#: Mean object size from which raw ``bytes`` samples cross through shared memory.
SHARED_BYTES_FROM = 64 << 10


def _to_bytes(tensor: torch.Tensor) -> bytes:
    """The main process's side of a :class:`HandedBytes`: a plain ``bytes`` copy."""
    return tensor.numpy().tobytes()


class HandedBytes(bytes):
    """A raw sample in a DataLoader worker: ``bytes``, pickled as its shared-memory tensor."""

    _tensor: torch.Tensor

    def __reduce__(self) -> tuple[Any, tuple[torch.Tensor]]:
        # The worker's pickler sends the tensor's storage by handle (torch's
        # reductions, or the segment pool's); any other pickler by value.
        return _to_bytes, (self._tensor,)


def hand_over(sample: Any) -> Any:
    """``sample`` (a tensor read for the hand-over) as a :class:`HandedBytes`; else unchanged."""
    if not isinstance(sample, torch.Tensor):
        return sample
    handed = HandedBytes(sample.numpy().data)
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
