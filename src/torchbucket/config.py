"""Configuration shared by every store: retries, throttling and timeouts.

All configs are frozen, keyword-only dataclasses validated on construction, so a
bad value fails where it is written, not deep inside a DataLoader worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchbucket.errors import ConfigError

__all__ = ["ConcurrencyConfig", "HedgeConfig", "RetryConfig"]


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be {bound}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryConfig:
    """How failed requests are retried.

    Backoff is exponential with full jitter: attempt ``n`` sleeps a random time in
    ``[0, min(max_backoff, initial_backoff * multiplier**n)]``, or what the server
    asked for in ``Retry-After`` when that is longer.

    Attributes:
        initial_backoff: Upper bound of the first sleep, seconds. Default 0.1.
        max_backoff: Cap on one sleep, seconds. Default 16.
        multiplier: Growth of the bound per attempt. Default 2.
        deadline: Total time one operation may take, all attempts and sleeps
            included, seconds. Default 300 (five minutes): long enough to ride out
            a throttling episode, short enough that a dead bucket is reported
            while someone is still watching.
        max_attempts: Cap on attempts, or ``None`` for no cap but the deadline.
            Default ``None``.
        attempt_timeout: Time one attempt may take before it counts as a
            transient failure (a stalled server), seconds. Default 120.
        read_timeout: Longest silence while reading a response body before the
            attempt counts as stalled, seconds. Default 30.
    """

    initial_backoff: float = 0.1
    max_backoff: float = 16.0
    multiplier: float = 2.0
    deadline: float = 300.0
    max_attempts: int | None = None
    attempt_timeout: float = 120.0
    read_timeout: float = 30.0

    def __post_init__(self) -> None:
        _positive("RetryConfig.initial_backoff", self.initial_backoff, allow_zero=True)
        _positive("RetryConfig.max_backoff", self.max_backoff, allow_zero=True)
        if self.multiplier < 1:
            raise ConfigError(f"RetryConfig.multiplier must be >= 1, got {self.multiplier!r}")
        _positive("RetryConfig.deadline", self.deadline)
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError(f"RetryConfig.max_attempts must be >= 1, got {self.max_attempts!r}")
        _positive("RetryConfig.attempt_timeout", self.attempt_timeout)
        _positive("RetryConfig.read_timeout", self.read_timeout)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConcurrencyConfig:
    """Requests in flight per process, adapted to the service (AIMD).

    The limit starts at ``initial``, grows by one for each ``limit`` successful
    requests, and halves (not below ``minimum``) when the service answers 429 or
    503, at most once per ``decrease_interval`` seconds so that one burst of
    rejections counts once.

    Attributes:
        initial: Starting limit. Default 128.
        minimum: Floor. Default 4.
        maximum: Ceiling. Default 512.
        decrease_interval: Seconds between two halvings. Default 0.5.
        adaptive: When ``False`` the limit stays at ``initial``. Default ``True``.
    """

    initial: int = 128
    minimum: int = 4
    maximum: int = 512
    decrease_interval: float = 0.5
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.minimum < 1:
            raise ConfigError(f"ConcurrencyConfig.minimum must be >= 1, got {self.minimum!r}")
        if not self.minimum <= self.initial <= self.maximum:
            raise ConfigError(
                "ConcurrencyConfig needs minimum <= initial <= maximum, got "
                f"{self.minimum} <= {self.initial} <= {self.maximum}"
            )
        _positive("ConcurrencyConfig.decrease_interval", self.decrease_interval, allow_zero=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class HedgeConfig:
    """Hedged reads: a second request for a read much slower than its peers.

    A read (an object, or a range of one) that has not answered after
    ``factor`` times the ``quantile`` of the recent reads of its size class
    (and at least ``floor`` seconds) is sent once more; the first answer wins,
    the other request is cancelled, and the bytes are verified as any read's.
    The second requests are bounded: each read earns ``budget`` of a hedge,
    at most ``burst`` are saved up, so over any stretch of reads at most
    ``budget`` of them (plus ``burst``) are hedged; a read whose wait ends
    with the budget spent asks again after each further wait. Each is a GET,
    billed as class B, counted in :mod:`torchbucket.accounting`
    (``hedges``). See docs/reliability.md for how hedges and retries
    interact.

    Attributes:
        enabled: Hedge reads at all. Default ``True``.
        quantile: Which quantile of the recent reads of a size class sets the
            wait. Default 0.95.
        factor: The wait is this times that quantile. Default 1.5.
        floor: The shortest wait before a hedge, seconds. Default 0.05.
        budget: Hedges per read, at most (the long-run fraction). Default 0.05.
        burst: Hedges that may be saved up. Default 10.
        min_samples: Reads of a size class seen before its quantile sets the
            wait. Default 32.
        initial_wait: The wait until then for reads under 1 MiB (or whole
            objects), seconds: long enough not to hedge a read that is merely
            slow, short enough to rescue one that stalls; longer ranges are
            not hedged until their class is known. Default 0.2 (was 0.5: a
            first batch of 64 GETs that met a 2 s stall under the emulator's
            ``same-region-tail`` waited 0.57 s, against ~0.2 s without).
        window: Recent reads remembered per size class. Default 512.
        max_bytes: Ranges longer than this are never hedged (a hedge of a
            range holds a second buffer of its size). Default 32 MiB.
    """

    enabled: bool = True
    quantile: float = 0.95
    factor: float = 1.5
    floor: float = 0.05
    budget: float = 0.05
    burst: float = 10.0
    min_samples: int = 32
    initial_wait: float = 0.2
    window: int = 512
    max_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ConfigError(f"HedgeConfig.quantile must be in (0, 1), got {self.quantile!r}")
        if self.factor < 1.0:
            raise ConfigError(f"HedgeConfig.factor must be >= 1, got {self.factor!r}")
        _positive("HedgeConfig.floor", self.floor, allow_zero=True)
        if not 0.0 <= self.budget <= 1.0:
            raise ConfigError(f"HedgeConfig.budget must be in [0, 1], got {self.budget!r}")
        if self.burst < 1.0:
            raise ConfigError(f"HedgeConfig.burst must be >= 1, got {self.burst!r}")
        if self.min_samples < 1 or self.window < self.min_samples:
            raise ConfigError(
                "HedgeConfig needs 1 <= min_samples <= window, got "
                f"min_samples={self.min_samples!r}, window={self.window!r}"
            )
        _positive("HedgeConfig.initial_wait", self.initial_wait, allow_zero=True)
        _positive("HedgeConfig.max_bytes", self.max_bytes)
