"""Time limits for many concurrent requests on one timer per event loop.

``asyncio.timeout`` (or a read timeout rescheduled on every chunk) schedules
and cancels a timer per request: a measurable share of a small read's client
CPU when thousands are in flight each second. A :class:`Watchdog` instead keeps
the limits of the requests in flight in a set and one timer, set for the
earliest moment something may have to be cut short; when it fires it cancels
the tasks whose limit passed and sets itself for the next. Starting and stopping
a watch costs a set insertion and removal; almost every timer firing finds
nothing to do.

A watch has a deadline (an attempt's time limit), or a silence limit (a read
that receives nothing for that long: ``progress`` is polled, every quarter of
the limit once something has been received), or both. A task cut short is
cancelled; :meth:`Watchdog.stop`, called where the task catches the
``CancelledError``, tells whether the cancellation was the watch's, as
``asyncio.timeout`` does (a cancellation from outside stays a cancellation).
"""

from __future__ import annotations

import asyncio
import math
import sys
import weakref
from collections.abc import Callable

__all__ = ["Watch", "Watchdog", "watchdog"]


class Watch:
    """One task's limits; made by :meth:`Watchdog.start`."""

    __slots__ = (
        "cancelling",
        "check",
        "deadline",
        "fired",
        "progress",
        "quiet",
        "seen",
        "silent_since",
        "task",
    )

    def __init__(
        self,
        task: asyncio.Task[object],
        deadline: float,
        quiet: float,
        progress: Callable[[], int] | None,
        now: float,
    ) -> None:
        self.task = task
        self.deadline = deadline
        self.quiet = quiet
        self.progress = progress
        self.seen = -1 if progress is None else progress()
        # A silence of ``quiet`` from the start is a stall: look then.
        self.silent_since = now
        self.check = now + quiet
        self.cancelling = 0
        if sys.version_info >= (3, 11):
            self.cancelling = task.cancelling()
        self.fired = False


class Watchdog:
    """The watches of one event loop, on one timer; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watches: set[Watch] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._when = math.inf

    def start(
        self,
        timeout: float | None = None,
        *,
        quiet: float | None = None,
        progress: Callable[[], int] | None = None,
    ) -> Watch:
        """Watch the current task.

        Args:
            timeout: Cut the task short this many seconds from now, or never.
            quiet: Cut it short once ``progress()`` has not changed for this
                many seconds (from now at first), or never.
            progress: A counter that grows while the task makes progress (bytes
                received); without it only the first ``quiet`` seconds count.

        Returns:
            The watch, to hand to :meth:`stop` whatever the outcome.
        """
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("Watchdog.start outside a task")
        now = self._loop.time()
        watch = Watch(
            task,
            math.inf if timeout is None else now + timeout,
            math.inf if quiet is None else quiet,
            progress,
            now,
        )
        self._watches.add(watch)
        due = min(watch.deadline, watch.check)
        if due < self._when:
            self._schedule(due)
        return watch

    def stop(self, watch: Watch) -> bool:
        """End ``watch``; whether the ``CancelledError`` in flight is its doing.

        Safe to call more than once. Where it returns ``True`` the caller turns
        the cancellation into its timeout error.
        """
        self._watches.discard(watch)
        if not watch.fired:
            return False
        watch.fired = False
        if sys.version_info >= (3, 11):
            return watch.task.uncancel() <= watch.cancelling
        return True

    def _schedule(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._when = when
        self._handle = self._loop.call_at(when, self._fire) if when < math.inf else None

    def _fire(self) -> None:
        self._handle = None
        self._when = math.inf
        now = self._loop.time()
        due = math.inf
        for watch in list(self._watches):
            if watch.deadline <= now or (watch.check <= now and self._stalled(watch, now)):
                self._watches.discard(watch)
                watch.fired = True
                watch.task.cancel()
                continue
            due = min(due, watch.deadline, watch.check)
        if due < math.inf:
            self._schedule(due)

    @staticmethod
    def _stalled(watch: Watch, now: float) -> bool:
        if watch.progress is not None:
            seen = watch.progress()
            if seen != watch.seen:
                # Progress since the last look: look again in a quarter of the
                # limit, so a stall is noticed at most a quarter late.
                watch.seen = seen
                watch.silent_since = now
                watch.check = now + watch.quiet / 4
                return False
        if now - watch.silent_since >= watch.quiet:
            return True
        watch.check = watch.silent_since + watch.quiet
        return False


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watchdog] = (
    weakref.WeakKeyDictionary()
)


def watchdog(loop: asyncio.AbstractEventLoop | None = None) -> Watchdog:
    """The watchdog of ``loop`` (default: the running loop), created on first use."""
    loop = loop or asyncio.get_running_loop()
    dog = _last
    if dog is not None and dog._loop is loop:
        return dog
    dog = _watchdogs.get(loop)
    if dog is None:
        dog = _watchdogs[loop] = Watchdog(loop)
    _remember(dog)
    return dog


def _remember(dog: Watchdog) -> None:
    global _last
    _last = dog


# The last one asked for: nearly always the background loop's.
_last: Watchdog | None = None
