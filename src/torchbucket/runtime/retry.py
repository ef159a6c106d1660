"""Retries with backoff and jitter, and adaptive concurrency per process.

``call(fn, ...)`` runs one store request under the process's
:class:`AdaptiveLimiter`, retrying what :func:`is_retryable` accepts, with
exponential backoff and full jitter, ``Retry-After`` honoured, until the
operation's deadline. Errors are told apart by type, never by message. Two
kinds of failure end sooner: a local endpoint that refuses connections
(:data:`UNREACHABLE_GIVE_UP_S`) and an answer that keeps coming back corrupt
(:data:`CORRUPT_ANSWERS`), on every path (JSON, XML and gRPC reads alike).

Logging: every attempt is logged at DEBUG; a WARNING is written once per episode
of failures (the first failure after a quiet minute), not once per attempt, so a
throttled epoch does not flood the log.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from torchbucket.config import RetryConfig
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
from torchbucket.runtime.limiter import AdaptiveLimiter, get_limiter

__all__ = ["AdaptiveLimiter", "backoff_delay", "call", "get_limiter", "is_retryable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EPISODE_QUIET_S = 60.0

#: How long a local endpoint that refuses connections is retried (an emulator
#: starting up answers within this), instead of the deadline: a stale emulator
#: address failed after 291 s of silence (issue 39).
UNREACHABLE_GIVE_UP_S = 3.0

#: A call gives up at its this-many-th corrupt answer (an
#: :class:`IntegrityError`: a checksum or length mismatch), raising that error,
#: instead of reading again until the deadline. A corruption on the wire is
#: independent from one answer to the next, so reading again heals it; bytes
#: corrupt at rest come back corrupt every time and were read until the
#: deadline (a 1 KiB object 201 times in a 6 s deadline over JSON; each range
#: of a 3 MiB object for the tests' 20 s over gRPC, whose chunks are all checked
#: inside the call: a JSON range carries no checksum, so a ranged object is
#: checked once after its ranges, by the dataset or checkpoint reader, which
#: reads it twice). Counted over the call, not only in a row: a gRPC range's
#: corrupt answers alternate with the breaks its stream's other ranges cause.
#: Four: a read hit three times in a row still heals
#: (tests/integration/test_read_integrity.py, ``thrice``).
CORRUPT_ANSWERS = 4


def is_retryable(exc: BaseException, *, idempotent: bool) -> bool:
    """Whether another attempt may succeed and is safe.

    Throttling, server errors, resets, timeouts and truncated bodies are worth
    retrying; so is a corrupted body on a read (:func:`call` gives up at the
    :data:`CORRUPT_ANSWERS`-th). Which HTTP statuses those are is
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


def _final_error(
    last: StorageError, operation: str, uri: str, *, corrupt: str, other: str
) -> StorageError:
    """The error raised when retrying ends: a prefix, then the last error's message.

    The last error's own message: its operation, URI and status are this
    error's too, and are named once (errors.StorageError.__str__). Corrupt
    answers until the end stay an :class:`IntegrityError` (after ``corrupt``),
    so that ``except IntegrityError`` catches them on every read path; any
    other error becomes a :class:`DeadlineExceededError` (after ``other``)
    naming the last error's type.
    """
    if isinstance(last, IntegrityError):
        return IntegrityError(
            corrupt + last.message, operation=operation, uri=uri, status=last.status
        )
    return DeadlineExceededError(
        f"{other}{type(last).__name__}: {last.message}",
        operation=operation,
        uri=uri,
        status=last.status,
    )


def _log_retry(error: StorageError, operation: str, uri: str, delay: float) -> None:
    """Log a retry: at DEBUG each, and a WARNING once per episode of the error's type."""
    if isinstance(error, UnreachableError):
        # It fails or recovers within seconds, and then the error says it all.
        logger.debug("%s %s failed (%s); retrying in %.2f s", operation, uri, error, delay)
        return
    _episodes.note(
        type(error).__name__,
        "%s %s failed (%s: %s); retrying in %.2f s",
        operation,
        uri,
        type(error).__name__,
        error.message,
        delay,
    )


def _throttled(limiter: AdaptiveLimiter | None, budget: Budget | None, spend: int) -> None:
    """Tell the limiter, the request counts and the budget of a throttled attempt."""
    if limiter is not None:
        limiter.on_throttle()
    accounting.throttle()
    if budget is not None:
        budget.throttled(spend)


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
            as what it is. Also at the :data:`CORRUPT_ANSWERS`-th corrupt
            answer, whatever the deadline left.
        StorageError: A failure that is not retryable, as raised by ``fn``.
    """
    start = time.monotonic()
    deadline = start + config.deadline
    failed: _Failed | None = None  # made at the first failure: the fast path makes none
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
            if isinstance(exc, asyncio.CancelledError) and not dog.stop(watch):
                raise  # cancelled from outside, not by the attempt's limit
            failed = failed or _Failed(config, operation, uri, start)
            error: StorageError = failed.timed_out(exc, timeout, cut_by_deadline)
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

        if isinstance(error, ThrottledError):
            _throttled(limiter, budget, spend)
        if not is_retryable(error, idempotent=idempotent):
            raise error
        failed = failed or _Failed(config, operation, uri, start)
        delay = failed.next_delay(error, rng)
        accounting.retried(delay, throttled=isinstance(error, ThrottledError))
        await asyncio.sleep(delay)


class _Failed:
    """A call's failed attempts so far, and what comes after one: a delay, or the error raised."""

    __slots__ = ("attempt", "config", "corrupt", "last", "operation", "start", "uri")

    def __init__(self, config: RetryConfig, operation: str, uri: str, start: float) -> None:
        self.config, self.operation, self.uri, self.start = config, operation, uri, start
        self.attempt = 0  # attempts failed and retried
        self.corrupt = 0  # of them, answers that were corrupt
        self.last: StorageError | None = None  # the previous attempt's error

    def timed_out(self, exc: BaseException, timeout: float, cut_by_deadline: bool) -> StorageError:
        """The error of an attempt cut short after ``timeout`` seconds.

        Raises it when the deadline cut the attempt (chained from the previous
        attempt's error, else from the timeout); returns it when the attempt's
        own limit did (a :class:`TransientError`, retried).
        """
        if cut_by_deadline:
            cause: BaseException = exc
            if isinstance(exc, asyncio.CancelledError):
                cause = asyncio.TimeoutError(f"attempt cut short after {timeout:.3g} s")
            raise self._cut_short() from (self.last if self.last is not None else cause)
        return TransientError(
            f"no answer within the {self.config.attempt_timeout:g} s attempt timeout",
            operation=self.operation,
            uri=self.uri,
        )

    def _cut_short(self) -> StorageError:
        """The error raised when the deadline cut an attempt short."""
        attempt = self.attempt
        why = (
            f"the {self.config.deadline:g} s retry deadline "
            f"({attempt + 1} attempt{'s' if attempt else ''}, "
            f"{time.monotonic() - self.start:.1f} s)"
        )
        if self.last is None:
            return DeadlineExceededError(
                f"no answer before {why}", operation=self.operation, uri=self.uri
            )
        # The cut attempt is not what failed: the tries before it were (an
        # endless throttle reported a bare timeout; every answer corrupt is
        # reported as that).
        return _final_error(
            self.last,
            self.operation,
            self.uri,
            corrupt=f"gave up at {why}; last answer: ",
            other=f"no answer before {why}; last error: ",
        )

    def next_delay(self, error: StorageError, rng: random.Random | None) -> float:
        """Seconds to wait before retrying after ``error``, or raise when retrying is over."""
        config = self.config
        self.last = error
        self.attempt += 1
        attempt = self.attempt
        if isinstance(error, IntegrityError):
            self.corrupt += 1
        delay = backoff_delay(attempt - 1, config, rng)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, retry_after)
        now = time.monotonic()
        if isinstance(error, UnreachableError):
            _give_up_unreachable(error, attempt, now - self.start, delay, config)
        if config.max_attempts is not None and attempt >= config.max_attempts:
            why = f"{attempt} attempts"
        elif self.corrupt >= CORRUPT_ANSWERS:
            why = f"{self.corrupt} corrupt answers"
        elif now + delay >= self.start + config.deadline:
            why = f"the {config.deadline:g} s retry deadline"
        else:
            _log_retry(error, self.operation, self.uri, delay)
            return delay
        gave_up = f"gave up after {why} ({now - self.start:.1f} s); last error: "
        raise _final_error(
            error, self.operation, self.uri, corrupt=gave_up, other=gave_up
        ) from error
