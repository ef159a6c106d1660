"""Adaptive concurrency per process: an AIMD limit on requests in flight.

:func:`torchbucket.runtime.retry.call` holds a slot of the process's
:class:`AdaptiveLimiter` during each attempt and tells it of successes and
throttles; both names are also in :mod:`torchbucket.runtime.retry`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import time
from collections.abc import Callable

from torchbucket.config import ConcurrencyConfig

__all__ = ["AdaptiveLimiter", "get_limiter"]

# Its log lines stay under the retry logger, where the limiter logged before it moved
# here (benchmarks/soak.py and log filters read them there).
logger = logging.getLogger("torchbucket.runtime.retry")


class AdaptiveLimiter:
    """AIMD limit on requests in flight.

    Additive increase: the limit grows by one after ``limit`` consecutive
    successes. Multiplicative decrease: it halves on 429/503, at most once per
    ``decrease_interval`` so one burst of rejections counts once.

    Must be used on one event loop only; :func:`get_limiter` gives each process
    (and each loop) its own.

    Args:
        config: Limits and growth.
        clock: Monotonic seconds (a simulation passes its own clock).
    """

    def __init__(
        self,
        config: ConcurrencyConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ConcurrencyConfig()
        self._clock = clock
        self._limit = float(self.config.initial_in_flight)
        self._in_flight = 0
        self._successes = 0
        self._last_decrease = -float("inf")
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.throttle_events = 0

    @property
    def limit(self) -> int:
        """The current number of requests allowed in flight."""
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        """Requests now in flight."""
        return self._in_flight

    def try_acquire(self) -> bool:
        """Take a slot if one is free now and nobody waits; whether it did."""
        if self._in_flight < int(self._limit) and not self._waiters:
            self._in_flight += 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait for a slot."""
        if self._in_flight < self.limit and not self._waiters:
            self._in_flight += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as we were cancelled: pass it on.
                self._in_flight -= 1
                self._wake()
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Give a slot back."""
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_flight += 1
                waiter.set_result(None)

    def on_success(self, n: int = 1) -> None:
        """Record ``n`` requests that were not throttled (as ``n`` calls of one)."""
        if not self.config.adaptive:
            return
        self._successes += n
        grew = False
        while self._successes >= self._limit:
            self._successes = max(0, self._successes - math.ceil(self._limit))
            if self._limit >= self.config.max_in_flight:
                self._successes = 0
                break
            self._limit += 1
            grew = True
        if grew and self._waiters:
            self._wake()

    def on_throttle(self) -> None:
        """Record a 429/503: halve the limit unless it was just halved."""
        self.throttle_events += 1
        if not self.config.adaptive:
            return
        now = self._clock()
        if now - self._last_decrease < self.config.decrease_interval:
            return
        self._last_decrease = now
        self._successes = 0
        self._limit = max(float(self.config.min_in_flight), self._limit / 2)
        logger.debug("throttled: concurrency limit now %d", self.limit)


_limiters: dict[tuple[int, int, str], AdaptiveLimiter] = {}


def get_limiter(name: str, config: ConcurrencyConfig | None = None) -> AdaptiveLimiter:
    """The limiter for ``name`` (an endpoint) in this process and loop."""
    loop = asyncio.get_running_loop()
    key = (os.getpid(), id(loop), name)
    limiter = _limiters.get(key)
    if limiter is None:
        # Drop limiters of dead loops (after fork, or a loop that was replaced).
        for stale in [k for k in _limiters if k[0] != key[0]]:
            del _limiters[stale]
        limiter = _limiters[key] = AdaptiveLimiter(config)
    return limiter
