"""Retries with backoff and jitter, and adaptive concurrency per process.

``call(fn, ...)`` runs one store request under the process's
:class:`AdaptiveLimiter`, retrying what :func:`is_retryable` accepts, with
exponential backoff and full jitter, ``Retry-After`` honoured, until the
operation's deadline. Errors are told apart by type, never by message.

Logging: every attempt is logged at DEBUG; a WARNING is written once per episode
of failures (the first failure after a quiet minute), not once per attempt, so a
throttled epoch does not flood the log.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from torchbucket.config import ConcurrencyConfig, RetryConfig
from torchbucket.errors import (
    DeadlineExceededError,
    IntegrityError,
    RetryableError,
    StorageError,
    ThrottledError,
    TransientError,
    UnreachableError,
)
from torchbucket.runtime import accounting, watchdog
from torchbucket.runtime.budget import Budget, budget_class

__all__ = ["AdaptiveLimiter", "backoff_delay", "call", "get_limiter", "is_retryable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EPISODE_QUIET_S = 60.0

#: How long a local endpoint that refuses connections is retried (an emulator
#: starting up answers within this), instead of the deadline: a stale emulator
#: address failed after 291 s of silence (issue 39).
UNREACHABLE_GIVE_UP_S = 3.0


def is_retryable(exc: BaseException, *, idempotent: bool) -> bool:
    """Whether another attempt may succeed and is safe.

    Throttling, server errors, resets, timeouts and truncated bodies are worth
    retrying; so is a corrupted body on a read. Which HTTP statuses those are is
    decided in one table, :data:`torchbucket.storage.gcs._errors.STATUS_ERRORS`
    (Google's retry strategy: 408, 429, 500, 502, 503, 504). A request that is
    not idempotent (a write without a precondition) is retried only after a
    429: the service refused it without acting on it. Any other failure of such
    a request may have taken effect, so it is not repeated (the GCS store makes
    its writes idempotent instead, by a generation precondition: see
    ``torchbucket.storage.gcs._uncertain.write``).
    """
    if not idempotent:
        return isinstance(exc, ThrottledError) and exc.status == 429
    return isinstance(exc, (RetryableError, IntegrityError))


def backoff_delay(attempt: int, config: RetryConfig, rng: random.Random | None = None) -> float:
    """Full-jitter backoff: a uniform draw below the attempt's exponential bound.

    Args:
        attempt: 0 for the sleep after the first failure.
        config: Bounds and growth.
        rng: Source of randomness (tests pass a seeded one).
    """
    try:
        bound = min(config.max_backoff, config.initial_backoff * config.multiplier**attempt)
    except OverflowError:
        # Long episodes with tiny backoffs reach ~1,000 attempts, where the
        # float power overflows; the bound has long been max_backoff by then.
        bound = config.max_backoff
    return (rng or random).uniform(0.0, bound)


class _EpisodeLog:
    """Writes a WARNING for the first failure of a kind after a quiet period."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def note(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        self._last[kind] = now
        if last is None or now - last > _EPISODE_QUIET_S:
            logger.warning(message + " (further retries of this kind are logged at DEBUG)", *args)
        else:
            logger.debug(message, *args)


_episodes = _EpisodeLog()


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


def _give_up_unreachable(
    error: UnreachableError, attempts: int, elapsed: float, delay: float, config: RetryConfig
) -> None:
    """Raise ``error`` once a local endpoint has refused for long enough."""
    if elapsed + delay < min(UNREACHABLE_GIVE_UP_S, config.deadline):
        return
    raise UnreachableError(
        f"gave up after {_plural_attempts(attempts)} ({elapsed:.1f} s): {error.message}",
        operation=error.operation,
        uri=error.uri,
    ) from error


def _plural_attempts(count: int) -> str:
    """``"1 attempt"``, ``"2 attempts"``."""
    return f"{count} attempt" if count == 1 else f"{count} attempts"


async def call(
    fn: Callable[[], Awaitable[T]],
    *,
    config: RetryConfig,
    operation: str,
    uri: str,
    idempotent: bool = True,
    limiter: AdaptiveLimiter | None = None,
    rng: random.Random | None = None,
    budget: Budget | None = None,
) -> T:
    """Run ``fn`` (one request) with retries, under ``limiter``.

    Args:
        fn: Makes one attempt; raises :mod:`torchbucket.errors` types.
        config: Backoff, deadline and per-attempt timeout.
        operation: Named in errors and logs.
        uri: Named in errors and logs.
        idempotent: Whether a repeat is safe (see :func:`is_retryable`).
        limiter: Concurrency limit to hold a slot of during each attempt.
        rng: Randomness for jitter.
        budget: The job-wide request budget to spend one request of before
            each attempt (its turn waited for first), or ``None``.

    Raises:
        UnreachableError: A local endpoint still refused connections after
            :data:`UNREACHABLE_GIVE_UP_S` seconds (or the deadline, if shorter).
        DeadlineExceededError: Still failing when the deadline came, or when the
            attempt cap was reached; chained from the last error. Also when the
            deadline cut an attempt short (a write that is not retried included).
        IntegrityError: As above, when the last attempt's answer was corrupt
            (a checksum or length mismatch): a persistent mismatch is reported
            as what it is.
        StorageError: A failure that is not retryable, as raised by ``fn``.
    """
    start = time.monotonic()
    deadline = start + config.deadline
    attempt = 0
    last: StorageError | None = None  # the previous attempt's error
    dog = watchdog.watchdog()
    spend = budget_class(operation) if budget is not None else 0
    while True:
        if budget is not None:
            await budget.turn(spend)
        remaining = deadline - time.monotonic()
        # The attempt's own limit, or what is left before the deadline if less.
        cut_by_deadline = remaining < config.attempt_timeout
        timeout = min(config.attempt_timeout, max(remaining, 0.001))
        if limiter is not None and not limiter.try_acquire():
            await limiter.acquire()
        # One watchdog timer per loop rather than a timer per attempt
        # (asyncio.timeout's): a measurable share of a small read's client CPU.
        watch = dog.start(timeout)
        try:
            result = await fn()
        except (asyncio.CancelledError, asyncio.TimeoutError) as exc:
            cause: BaseException = exc
            if isinstance(exc, asyncio.CancelledError):
                if not dog.stop(watch):
                    raise  # cancelled from outside, not by the attempt's limit
                cause = asyncio.TimeoutError(f"attempt cut short after {timeout:.3g} s")
            if cut_by_deadline:
                why = (
                    f"the {config.deadline:g} s retry deadline "
                    f"({attempt + 1} attempt{'s' if attempt else ''}, "
                    f"{time.monotonic() - start:.1f} s)"
                )
                if isinstance(last, IntegrityError):
                    # Every answer was corrupt: that, not the cut, is what persisted.
                    raise IntegrityError(
                        f"gave up at {why}; last answer: {last.message}",
                        operation=operation,
                        uri=uri,
                        status=last.status,
                    ) from last
                if last is not None:
                    # The cut attempt is not what failed: the tries before it
                    # were (an endless throttle reported a bare timeout).
                    raise DeadlineExceededError(
                        f"no answer before {why}; last error: "
                        f"{type(last).__name__}: {last.message}",
                        operation=operation,
                        uri=uri,
                        status=last.status,
                    ) from last
                raise DeadlineExceededError(
                    f"no answer before {why}", operation=operation, uri=uri
                ) from cause
            error: StorageError = TransientError(
                f"no answer within the {config.attempt_timeout:g} s attempt timeout",
                operation=operation,
                uri=uri,
            )
        except StorageError as exc:
            error = exc
        else:
            if limiter is not None:
                limiter.on_success()
            return result
        finally:
            dog.stop(watch)
            if limiter is not None:
                limiter.release()

        last = error
        if isinstance(error, ThrottledError) and limiter is not None:
            limiter.on_throttle()
        if isinstance(error, ThrottledError):
            accounting.throttle()
            if budget is not None:
                budget.throttled(spend)
        if not is_retryable(error, idempotent=idempotent):
            raise error
        attempt += 1
        delay = backoff_delay(attempt - 1, config, rng)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, retry_after)
        now = time.monotonic()
        if isinstance(error, UnreachableError):
            _give_up_unreachable(error, attempt, now - start, delay, config)
        out_of_attempts = config.max_attempts is not None and attempt >= config.max_attempts
        if out_of_attempts or now + delay >= deadline:
            why = (
                f"{attempt} attempts"
                if out_of_attempts
                else f"the {config.deadline:g} s retry deadline"
            )
            # The last error's own message: its operation, URI and status are
            # this error's too, and are named once (errors.StorageError.__str__).
            gave_up = f"gave up after {why} ({now - start:.1f} s); last error: "
            if isinstance(error, IntegrityError):
                # Corrupt answers until the end: the caller sees what they are,
                # so that `except IntegrityError` catches them on every read path.
                raise IntegrityError(
                    gave_up + error.message, operation=operation, uri=uri, status=error.status
                ) from error
            raise DeadlineExceededError(
                f"{gave_up}{type(error).__name__}: {error.message}",
                operation=operation,
                uri=uri,
                status=error.status,
            ) from error
        if isinstance(error, UnreachableError):
            # It fails or recovers within seconds, and then the error says it all.
            logger.debug("%s %s failed (%s); retrying in %.2f s", operation, uri, error, delay)
        else:
            _episodes.note(
                type(error).__name__,
                "%s %s failed (%s: %s); retrying in %.2f s",
                operation,
                uri,
                type(error).__name__,
                error.message,
                delay,
            )
        accounting.retried(delay, throttled=isinstance(error, ThrottledError))
        await asyncio.sleep(delay)
