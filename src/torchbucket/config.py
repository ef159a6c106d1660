"""Configuration shared by every store: retries, throttling and timeouts.

All configs are frozen, keyword-only dataclasses validated on construction, so a
bad value fails where it is written, not deep inside a DataLoader worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchbucket._checks import (
    check_config,
    config_error,
    count,
    in_flight,
    number,
    seconds,
    size,
    switch,
)

__all__ = ["ConcurrencyConfig", "HedgeConfig", "RetryConfig"]


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

    initial_backoff: float = seconds(0.1)
    max_backoff: float = seconds(16.0)
    multiplier: float = number(2.0, minimum=1)
    deadline: float = seconds(300.0, positive=True)
    max_attempts: int | None = count(None, optional=True)
    attempt_timeout: float = seconds(120.0, positive=True)
    read_timeout: float = seconds(30.0, positive=True)

    def __post_init__(self) -> None:
        check_config(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConcurrencyConfig:
    """Requests in flight per process, adapted to the service (AIMD).

    The limit starts at ``initial_in_flight``, grows by one for each ``limit``
    successful requests (not above ``max_in_flight``), and halves (not below
    ``min_in_flight``) when the service answers 429 or
    503, at most once per ``decrease_interval`` seconds so that one burst of
    rejections counts once.

    Attributes:
        initial_in_flight: Starting limit. Default 128.
        min_in_flight: Floor. Default 4.
        max_in_flight: Ceiling; it also sizes a GCS store's connection pool.
            Default 512.
        decrease_interval: Seconds between two halvings. Default 0.5.
        adaptive: When ``False`` the limit stays at ``initial_in_flight``.
            Default ``True``.
    """

    initial_in_flight: int = in_flight(128)
    min_in_flight: int = in_flight(4)
    max_in_flight: int = in_flight(512)
    decrease_interval: float = seconds(0.5)
    adaptive: bool = switch(True)

    def __post_init__(self) -> None:
        check_config(self)
        if not self.min_in_flight <= self.initial_in_flight <= self.max_in_flight:
            raise config_error(
                self,
                "initial_in_flight",
                self.initial_in_flight,
                f"in min_in_flight..max_in_flight ({self.min_in_flight}..{self.max_in_flight})",
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class HedgeConfig:
    """Hedged reads: a second request for a read much slower than its peers.

    A read (an object, or a range of one) that has not answered after
    ``factor`` times the ``quantile`` of the recent reads of its size class
    (and at least ``floor`` seconds) is sent once more; the first answer wins,
    the other request is cancelled, and the bytes are verified as any read's.
    The second requests are bounded: each read earns ``budget`` of a hedge,
    at most ``burst`` are saved up (a new process starts with them), so over
    any stretch of reads at most ``budget`` of them (plus ``burst``) are
    hedged; a read whose wait ends with the budget spent asks again after
    each further wait. Each is a GET,
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
            objects of unknown length), seconds: long enough not to hedge a
            read that is merely slow, short enough to rescue one that stalls;
            longer reads wait this plus a second per 25 MB of their length
            (0.24 s for 1 MiB, 0.54 s for an 8 MiB range). Default 0.2.
        window: Recent reads remembered per size class. Default 512.
        max_read_size: Reads (ranges, objects) longer than this are never
            hedged (a hedge holds a second buffer of the read's size).
            Default 32 MiB.
    """

    enabled: bool = switch(True)
    quantile: float = number(0.95, above=0.0, below=1.0)
    factor: float = number(1.5, minimum=1.0)
    floor: float = seconds(0.05)
    budget: float = number(0.05, minimum=0.0, maximum=1.0)
    burst: float = number(10.0, minimum=1.0)
    min_samples: int = count(32)
    initial_wait: float = seconds(0.2)
    window: int = count(512)
    max_read_size: int = size(32 << 20)

    def __post_init__(self) -> None:
        check_config(self)
        if self.window < self.min_samples:
            raise config_error(self, "window", self.window, f">= min_samples ({self.min_samples})")
