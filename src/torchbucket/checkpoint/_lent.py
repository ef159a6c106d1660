"""Parts uploaded straight out of the tensors being saved, without a copy (issue 45).

``torch.save`` hands the writer each tensor's bytes in one ``write`` call, a
view of the tensor's own storage (a CPU tensor's; another device's is first
copied into a temporary CPU storage). The writer copies what it is given into
part buffers, because the view is valid only during the call. That copy was
most of what a save cost beyond the floor's upload: 0.17 CPU s per 512 MiB on
the 2-core benchmark VM, against 0.02 s for ``torch.save``'s own work and
0.1 s for the CRC32C of every byte.

:meth:`BucketCheckpoint.save` knows the object it saves: :func:`collect`
finds the CPU storages of the tensors in it (through dicts, lists and tuples,
as in a state dict) and the writer keeps references to them until the save
ends, so a ``write`` whose bytes lie inside one of them stays valid after the
call. Such a write (of at least ``_gather.LEND_MIN`` bytes) becomes pieces of
the parts it falls in, views of the tensor, between the copied bytes of the
other writes (:mod:`._gather`): no byte of those tensors is copied.

The bytes sent are the tensor's at the time each part is sent, not at the
time of the ``write``: a tensor changed by another thread while it is saved
(as training that goes on would) makes its part's CRC32C, taken at the
``write``, differ from what is sent, and the save fails instead of storing a
torn checkpoint (``AsyncBucketCheckpointIO`` saves a copy for that reason).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

__all__ = ["LentMemory", "collect"]

#: How deep :func:`collect` looks into nested dicts, lists and tuples.
_MAX_DEPTH = 16


class LentMemory:
    """The address ranges of the storages a save holds, and references to them."""

    def __init__(self, storages: list[Any]) -> None:
        spans = sorted({(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages if s.nbytes()})
        self._starts = [start for start, _ in spans]
        self._ends = [end for _, end in spans]
        self._storages = storages  # alive until the writer lets go of this

    def __bool__(self) -> bool:
        return bool(self._starts)

    def holds(self, view: memoryview) -> bool:
        """Whether all of ``view`` lies inside one of the storages."""
        if not self._starts or not len(view):
            return False
        address = int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
        index = bisect.bisect_right(self._starts, address) - 1
        return index >= 0 and address + len(view) <= self._ends[index]


def collect(obj: object) -> LentMemory:
    """The CPU storages of the plain tensors in ``obj`` (nested dicts, lists, tuples)."""
    import torch

    storages: list[Any] = []
    seen: set[int] = set()

    def visit(value: object, depth: int) -> None:
        if type(value) in (torch.Tensor, torch.nn.Parameter):
            tensor: torch.Tensor = value  # type: ignore[assignment]
            if tensor.device.type == "cpu" and tensor.layout == torch.strided:
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    storages.append(storage)
        elif depth < _MAX_DEPTH and isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)
        elif depth < _MAX_DEPTH and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)

    visit(obj, 0)
    return LentMemory(storages)
