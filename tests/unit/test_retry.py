from __future__ import annotations

import asyncio
import logging
import random

import pytest

from torchbucket.config import ConcurrencyConfig, RetryConfig
from torchbucket.errors import (
    ConfigError,
    DeadlineExceededError,
    IntegrityError,
    NotFoundError,
    ThrottledError,
    TransientError,
)
from torchbucket.runtime import retry

FAST = RetryConfig(initial_backoff=0.001, max_backoff=0.002, deadline=5.0)


def _flaky(failures: list[Exception], result: str = "ok") -> tuple[list[int], object]:
    calls: list[int] = []

    async def fn() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return result

    return calls, fn


def test_retries_transient_errors_until_success() -> None:
    calls, fn = _flaky([TransientError("503"), ThrottledError("429"), IntegrityError("crc")])
    out = asyncio.run(retry.call(fn, config=FAST, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert out == "ok"
    assert len(calls) == 4


def test_does_not_retry_not_found() -> None:
    calls, fn = _flaky([NotFoundError("gone", operation="get", uri="gs://b/k")])
    with pytest.raises(NotFoundError):
        asyncio.run(retry.call(fn, config=FAST, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert len(calls) == 1


def test_never_retries_a_non_idempotent_write() -> None:
    calls, fn = _flaky([TransientError("reset")])
    with pytest.raises(TransientError):
        asyncio.run(
            retry.call(fn, config=FAST, operation="put", uri="gs://b/k", idempotent=False)  # type: ignore[arg-type]
        )
    assert len(calls) == 1


def test_a_non_idempotent_write_is_retried_after_a_429_only() -> None:
    refused = ThrottledError("slow down", operation="put", uri="gs://b/k", status=429)
    calls, fn = _flaky([refused])
    out = asyncio.run(
        retry.call(fn, config=FAST, operation="put", uri="gs://b/k", idempotent=False)  # type: ignore[arg-type]
    )
    assert out == "ok"
    assert len(calls) == 2
    unavailable = ThrottledError("unavailable", operation="put", uri="gs://b/k", status=503)
    calls, fn = _flaky([unavailable])
    with pytest.raises(ThrottledError):
        asyncio.run(
            retry.call(fn, config=FAST, operation="put", uri="gs://b/k", idempotent=False)  # type: ignore[arg-type]
        )
    assert len(calls) == 1


def test_gives_up_after_max_attempts_with_the_last_error_chained() -> None:
    config = RetryConfig(initial_backoff=0.001, max_attempts=3, deadline=5.0)
    calls, fn = _flaky([TransientError(str(i)) for i in range(10)])
    with pytest.raises(DeadlineExceededError, match="3 attempts") as info:
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert len(calls) == 3
    assert isinstance(info.value.__cause__, TransientError)
    assert "gs://b/k" in str(info.value)
    assert isinstance(info.value, TimeoutError)


def test_a_stalled_attempt_times_out_and_the_deadline_ends_the_operation() -> None:
    config = RetryConfig(initial_backoff=0.001, attempt_timeout=0.05, deadline=0.3)

    async def stall() -> str:
        await asyncio.sleep(60)
        return "never"

    with pytest.raises(DeadlineExceededError, match="deadline") as info:
        asyncio.run(retry.call(stall, config=config, operation="get", uri="gs://b/slow"))
    assert "gs://b/slow" in str(info.value)


def test_retry_after_is_honoured() -> None:
    err = ThrottledError("429")
    err.retry_after = 0.2
    calls, fn = _flaky([err])
    config = RetryConfig(initial_backoff=0.0, deadline=0.1)
    # Waiting 0.2 s would pass the 0.1 s deadline, so the call gives up at once.
    with pytest.raises(DeadlineExceededError):
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert len(calls) == 1


def test_backoff_is_full_jitter_below_an_exponential_bound() -> None:
    config = RetryConfig(initial_backoff=0.1, multiplier=2, max_backoff=1.0)
    rng = random.Random(0)
    for attempt, bound in [(0, 0.1), (1, 0.2), (2, 0.4), (5, 1.0)]:
        draws = [retry.backoff_delay(attempt, config, rng) for _ in range(200)]
        assert all(0 <= d <= bound for d in draws)
        assert max(draws) > bound * 0.8


def test_backoff_past_float_range_stays_at_the_cap() -> None:
    # 2.0**1100 overflows a float; a long episode of tiny backoffs gets there.
    config = RetryConfig(initial_backoff=1e-6, multiplier=2, max_backoff=0.5)
    rng = random.Random(0)
    draws = [retry.backoff_delay(1100, config, rng) for _ in range(200)]
    assert all(0 <= d <= 0.5 for d in draws)
    assert max(draws) > 0.4


def test_one_warning_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    retry._episodes._last.clear()
    calls, fn = _flaky([TransientError("a"), TransientError("b"), TransientError("c")])
    with caplog.at_level(logging.DEBUG, logger="torchbucket.runtime.retry"):
        asyncio.run(retry.call(fn, config=FAST, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(calls) == 4
    assert len(warnings) == 1
    assert "gs://b/k" in warnings[0].getMessage()


def test_limiter_halves_on_throttle_and_grows_back() -> None:
    limiter = retry.AdaptiveLimiter(
        ConcurrencyConfig(
            initial_in_flight=64, min_in_flight=4, max_in_flight=128, decrease_interval=0.0
        )
    )
    limiter.on_throttle()
    assert limiter.limit == 32
    for _ in range(5):
        limiter.on_throttle()
    assert limiter.limit == 4
    for _ in range(4 + 5 + 6):
        limiter.on_success()
    assert limiter.limit == 7


def test_limiter_counts_one_burst_once() -> None:
    limiter = retry.AdaptiveLimiter(ConcurrencyConfig(initial_in_flight=64, decrease_interval=60.0))
    for _ in range(50):
        limiter.on_throttle()
    assert limiter.limit == 32
    assert limiter.throttle_events == 50


def test_limiter_bounds_requests_in_flight() -> None:
    limiter = retry.AdaptiveLimiter(
        ConcurrencyConfig(initial_in_flight=4, min_in_flight=1, max_in_flight=4)
    )
    peak = 0

    async def one() -> None:
        nonlocal peak
        await limiter.acquire()
        try:
            peak = max(peak, limiter.in_flight)
            await asyncio.sleep(0.001)
        finally:
            limiter.release()

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(50)))

    asyncio.run(main())
    assert peak == 4
    assert limiter.in_flight == 0


def test_limiter_survives_cancelled_waiters() -> None:
    limiter = retry.AdaptiveLimiter(
        ConcurrencyConfig(initial_in_flight=1, min_in_flight=1, max_in_flight=1)
    )

    async def main() -> None:
        await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        limiter.release()
        await asyncio.wait_for(limiter.acquire(), 1)
        limiter.release()

    asyncio.run(main())
    assert limiter.in_flight == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"deadline": 0}, {"multiplier": 0.5}, {"max_attempts": 0}, {"initial_backoff": -1}],
)
def test_retry_config_validates(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RetryConfig(**kwargs)  # type: ignore[arg-type]


def test_concurrency_config_validates() -> None:
    with pytest.raises(
        ConfigError, match=r"initial_in_flight must be in min_in_flight\.\.max_in_flight"
    ):
        ConcurrencyConfig(initial_in_flight=2, min_in_flight=4)


@pytest.mark.parametrize("idempotent", [True, False])
def test_an_attempt_cut_short_by_the_deadline_is_a_deadline_error(idempotent: bool) -> None:
    # The attempt timeout (5 s) is longer than the deadline (0.2 s): the deadline cuts
    # the stalled write off, and says so, even where a failed write is not repeated.
    config = RetryConfig(initial_backoff=0.001, attempt_timeout=5.0, deadline=0.2)

    async def stall() -> str:
        await asyncio.sleep(60)
        return "never"

    with pytest.raises(DeadlineExceededError, match=r"0\.2 s retry deadline") as info:
        asyncio.run(
            retry.call(stall, config=config, operation="put", uri="gs://b/k", idempotent=idempotent)
        )
    assert "gs://b/k" in str(info.value)
    assert "0.0 s" not in str(info.value)


def test_an_attempt_timeout_names_the_attempt_timeout() -> None:
    config = RetryConfig(initial_backoff=0.001, attempt_timeout=0.05, deadline=5.0)

    async def stall() -> str:
        await asyncio.sleep(60)
        return "never"

    with pytest.raises(TransientError, match=r"no answer within the 0\.05 s attempt timeout"):
        asyncio.run(
            retry.call(stall, config=config, operation="put", uri="gs://b/k", idempotent=False)
        )


def test_corrupt_answers_until_the_end_are_an_integrity_error() -> None:
    """`except IntegrityError` catches a mismatch that persists, not a deadline error."""
    config = RetryConfig(initial_backoff=0.001, max_backoff=0.002, max_attempts=4, deadline=5.0)
    calls, fn = _flaky([IntegrityError("CRC32C mismatch", status=None) for _ in range(9)])
    with pytest.raises(IntegrityError, match="gave up after 4 attempts") as info:
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert len(calls) == 4
    assert not isinstance(info.value, DeadlineExceededError)
    assert str(info.value).count("gs://b/k") == 1


def test_an_answer_corrupt_every_time_fails_at_the_corrupt_answers_cap_not_the_deadline() -> None:
    """Bytes corrupt at rest: a few reads, then the IntegrityError, not a minute of reads."""
    config = RetryConfig(initial_backoff=0.001, max_backoff=0.002, deadline=60.0)
    calls, fn = _flaky([IntegrityError("CRC32C mismatch") for _ in range(50)])
    with pytest.raises(IntegrityError, match="CRC32C mismatch") as info:
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert len(calls) == retry.CORRUPT_ANSWERS
    assert f"gave up after {retry.CORRUPT_ANSWERS} corrupt answers" in str(info.value)
    assert str(info.value).count("gs://b/k") == 1


def test_corrupt_answers_are_counted_over_the_call_and_fewer_heal() -> None:
    """A gRPC range's corrupt answers alternate with breaks its stream's other ranges cause."""
    config = RetryConfig(initial_backoff=0.001, max_backoff=0.002, deadline=60.0)
    cap = retry.CORRUPT_ANSWERS

    def alternating(corrupt: int) -> list[Exception]:
        out: list[Exception] = []
        for _ in range(corrupt):
            out += [IntegrityError("CRC32C mismatch"), TransientError("stream ended")]
        return out

    calls, fn = _flaky(alternating(cap - 1))  # then an answer: a transient corruption heals
    assert asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k")) == "ok"  # type: ignore[arg-type]
    assert len(calls) == 2 * (cap - 1) + 1
    calls, fn = _flaky(alternating(cap + 5))
    with pytest.raises(IntegrityError, match=f"gave up after {cap} corrupt answers"):
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    assert len(calls) == 2 * cap - 1


def test_a_deadline_that_cuts_an_attempt_after_corrupt_answers_is_an_integrity_error() -> None:
    config = RetryConfig(
        initial_backoff=0.001, max_backoff=0.002, attempt_timeout=5.0, deadline=0.2
    )
    answers = 0

    async def corrupt_then_stall() -> str:
        nonlocal answers
        answers += 1
        if answers <= 3:
            raise IntegrityError("CRC32C mismatch")
        await asyncio.sleep(60)
        return "never"

    with pytest.raises(IntegrityError, match="CRC32C mismatch"):
        asyncio.run(retry.call(corrupt_then_stall, config=config, operation="get", uri="gs://b/k"))


def test_a_deadline_error_names_the_status_once() -> None:
    config = RetryConfig(initial_backoff=0.001, max_attempts=2, deadline=5.0)
    _, fn = _flaky([ThrottledError("slow down", operation="get", uri="gs://b/k", status=503)] * 3)
    with pytest.raises(DeadlineExceededError) as info:
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))  # type: ignore[arg-type]
    text = str(info.value)
    assert text.startswith("get gs://b/k: gave up after 2 attempts (")
    assert text.endswith("; last error: ThrottledError: slow down (HTTP 503)")
    assert text.count("gs://b/k") == 1 and text.count("HTTP 503") == 1


def test_a_deadline_that_cuts_a_try_short_names_the_error_of_the_tries_before() -> None:
    # Each try fails at once until the last, which hangs and is cut short by
    # the deadline: the error chains from the failures, not from the cut.
    config = RetryConfig(initial_backoff=0.001, max_backoff=0.001, deadline=0.3)
    failures = 0

    async def fn() -> None:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise TransientError("503 from the server", status=503)
        await asyncio.sleep(10)

    with pytest.raises(DeadlineExceededError, match="last error: TransientError") as info:
        asyncio.run(retry.call(fn, config=config, operation="get", uri="gs://b/k"))
    assert isinstance(info.value.__cause__, TransientError)
    assert info.value.status == 503
