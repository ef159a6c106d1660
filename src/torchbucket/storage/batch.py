"""Reads a caller waits for together, so that their last stragglers are hedged early.

A map-style batch read batch at a time (``BucketMapDataset.__getitems__``
with a sampler it cannot read ahead of)
lasts as long as its slowest read. A read is hedged when it has run ``factor``
times the recent 95th percentile of its size class (``HedgeConfig``); in a
batch, the read that holds everything up is known sooner: it is one of the
last few still running once the others have answered. Inside
:func:`read_batch`, once all but ``1/32`` of the batch's reads (at least one)
have answered, and at least 8 have, each read still running is hedged as soon
as it has run twice the median of the batch's answered reads (and at least
``HedgeConfig.floor``), if that comes before its own wait. The budget is the
same: each hedge still spends one of ``HedgeConfig.budget``'s.

Measured with ``benchmarks/dataloading.py --quick --datasets 100kib --only
tb_map`` (10,000 x 100 KiB, batches of 64, 2 workers, 2-core VM), two runs of
3 against two without: under the emulator's ``same-region-tail`` the plain
sampler's epoch went from 1,020-1,040 to 1,110-1,180 samples/s and the mean
wait for a batch from 0.060-0.062 to 0.053-0.054 s, for 2.9% hedged GETs
instead of 0.9%; the p99 of a batch's fetch stayed 0.22-0.24 s (its p50 fell
from 0.115 to 0.102 s). Under the constant ``same-region`` preset nothing more
was hedged (0-0.07% of GETs).

The batch lives in a :class:`contextvars.ContextVar`, so it reaches the reads
that the batch's coroutine starts (``asyncio`` tasks copy the context), and
no other.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

__all__ = ["ReadBatch", "current_batch", "read_batch"]

#: Stragglers: the reads still running when at most this share of the batch
#: (and at least one read) has not answered.
_STRAGGLERS = 1 / 32
#: Answered reads before the median is trusted.
_MIN_ANSWERED = 8
#: A straggler is hedged once it has run this many times the batch's median.
_TIMES_MEDIAN = 2.0

Hurry = Callable[[float], None]

_current: contextvars.ContextVar[ReadBatch | None] = contextvars.ContextVar(
    "torchbucket_read_batch", default=None
)


class ReadBatch:
    """The reads of one batch: how many began, which still run, how long the others took."""

    __slots__ = ("_answered", "_began", "_running")

    def __init__(self) -> None:
        self._began = 0
        self._running: dict[int, Hurry | None] = {}
        self._answered: list[float] = []

    def begin(self, hurry: Hurry | None) -> int:
        """A read of the batch begins; ``hurry(seconds)`` asks it to hedge after ``seconds``.

        Returns:
            The read's key, for :meth:`end`.
        """
        key = self._began
        self._began += 1
        self._running[key] = hurry
        return key

    def end(self, key: int, seconds: float | None) -> None:
        """The read ``key`` is over: answered after ``seconds``, or failed (``None``)."""
        self._running.pop(key, None)
        if seconds is not None:
            self._answered.append(seconds)
        running = self._running
        if not running or len(self._answered) < _MIN_ANSWERED:
            return
        if len(running) > max(1, int(self._began * _STRAGGLERS)):
            return
        answered = sorted(self._answered)
        self.hurry(_TIMES_MEDIAN * answered[len(answered) // 2])

    def hurry(self, after: float) -> None:
        """Have each read still running hedged once it has run ``after`` seconds, if sooner."""
        for hurry in list(self._running.values()):
            if hurry is not None:
                hurry(after)


def current_batch() -> ReadBatch | None:
    """The batch the running task's reads belong to, if any."""
    return _current.get()


@contextlib.contextmanager
def read_batch() -> Iterator[ReadBatch]:
    """Make the reads started inside (by this task and the tasks it creates) one batch."""
    batch = ReadBatch()
    token = _current.set(batch)
    try:
        yield batch
    finally:
        _current.reset(token)
