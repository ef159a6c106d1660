"""The requests of a dataset's last epoch, summed over DataLoader workers.

Each process counts its own requests (:mod:`torchbucket.accounting`); a
DataLoader worker is a process of its own (fork or spawn), so its counts never
reach the main process by themselves. A dataset therefore owns a small board in
shared memory (a float64 tensor, shared like the iterable dataset's epoch cell:
inherited by forked workers, passed by handle to spawned ones):

- row 0 is the header: ``[mark, passes begun]``;
- row ``1 + w`` belongs to DataLoader worker ``w``, the last row to a process
  without workers (the main process). A row is ``[mark, workers, pass number,
  counts...]``, the counts in :meth:`RequestStats.to_vector`'s order.

A process *begins a pass* (its row zeroed and stamped with the pass's mark, the
number of workers and a pass number; its counter snapshot taken as the
baseline) when its epoch starts, and *flushes* (writes ``snapshot() -
baseline`` over its counts; whole rows are only ever overwritten by their one
owner, so no lock) as it goes and at the end. The last epoch is then the sum of
the rows that share the mark and the worker count of the pass begun last.

What is counted is everything the process asked of any store while the pass
ran: in a DataLoader worker that is the dataset's reading; without workers it
includes whatever else the main process did meanwhile.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import get_worker_info

from torchbucket.runtime import accounting
from torchbucket.runtime.accounting import RequestStats

__all__ = ["MAX_WORKERS", "EpochBoard"]

#: DataLoader workers a board has rows for; workers above it are not counted.
MAX_WORKERS = 256
_HEAD = 3  # mark, workers, pass number
_MAIN_ROW = MAX_WORKERS + 1


class EpochBoard:
    """Per-worker request counts of a dataset's current (or last) epoch."""

    def __init__(self) -> None:
        width = _HEAD + accounting.VECTOR_LEN
        self._cells = torch.zeros(MAX_WORKERS + 2, width, dtype=torch.float64).share_memory_()  # type: ignore[no-untyped-call]
        self._local: tuple[int, Any, int, RequestStats] | None = None  # pid, view, row, base

    def __getstate__(self) -> dict[str, Any]:
        return {"_cells": self._cells, "_local": None}

    def _view(self) -> Any:
        # A numpy view of the shared memory: writing a row costs a microsecond.
        return self._cells.numpy()

    def begin(self, mark: int) -> None:
        """Start this process's pass of epoch ``mark``: its row counts from now."""
        info = get_worker_info()
        if info is None:
            row, workers = _MAIN_ROW, 0
        elif info.id < MAX_WORKERS:
            row, workers = 1 + info.id, info.num_workers
        else:
            self._local = None
            return
        view = self._view()
        view[0, 1] += 1  # two workers beginning at once may share a pass number: harmless
        view[row, _HEAD:] = 0.0
        view[row, :_HEAD] = (mark, workers, view[0, 1])
        self._local = (os.getpid(), view, row, accounting.snapshot())

    def begun(self, mark: int) -> bool:
        """Whether this process has begun a pass of epoch ``mark``."""
        local = self._local
        return local is not None and local[0] == os.getpid() and local[1][local[2], 0] == mark

    def flush(self) -> None:
        """Write this process's counts since :meth:`begin` into its row."""
        local = self._local
        if local is None or local[0] != os.getpid():
            return
        _, view, row, base = local
        view[row, _HEAD:] = (accounting.snapshot() - base).to_vector()

    @property
    def mark(self) -> int:
        """The epoch mark set by :meth:`new_mark` (0 before any)."""
        return int(self._cells[0, 0])

    def new_mark(self) -> None:
        """Make every process begin a new pass at its next read (see ``begun``)."""
        self._cells[0, 0] += 1

    def last(self) -> RequestStats:
        """The counts of the pass begun last, summed over the rows that belong to it."""
        view = self._view()
        used = view[1:, 2] > 0
        if not used.any():
            return RequestStats()
        rows = view[1:][used]
        latest = rows[rows[:, 2].argmax()]
        same = (rows[:, 0] == latest[0]) & (rows[:, 1] == latest[1])
        return RequestStats.from_vector(rows[same, _HEAD:].sum(axis=0))
