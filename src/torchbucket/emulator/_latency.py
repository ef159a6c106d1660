"""Cloud latency, bandwidth and a requests-per-second cap, modelled with sleeps.

Every sleep is an ``asyncio.sleep`` on the server's loop, so a modelled delay
never blocks other requests: many requests in flight overlap their latency as
they would against a real bucket.

A :class:`LatencyModel` gives each operation class (reads, list pages, writes)
a median time to answer. With ``tail_p99 > 1`` each request's time is drawn
from a log-normal distribution around that median whose 99th percentile is
``tail_p99`` times the median, and with ``stall_probability > 0`` a request
now and then waits ``stall_seconds`` more (a straggler, not a failure: the
answer then comes, whole and correct), before the request is applied or
after, with equal chance. Draws come from a
:class:`LatencySampler` seeded with the model's ``seed``: the same requests in
the same order wait the same times, run after run. Bandwidth (the transfer
time of a body) is never drawn: the tail is in the time to the first byte.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from torchbucket.errors import ConfigError

__all__ = [
    "PRESETS",
    "SAME_REGION_TAIL",
    "LatencyModel",
    "LatencySampler",
    "RateCap",
    "resolve_latency",
]

# Operation -> which latency figure applies.
_READ_OPS = frozenset({"get", "head", "iam", "bucket_get", "mpu_parts"})
_LIST_OPS = frozenset({"list", "mpu_list", "bucket_list"})
# The standard normal's 99th percentile: sigma = ln(tail_p99) / _Z99.
_Z99 = 2.3263478740408408


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyModel:
    """Latency and bandwidth per operation class, constant or with a tail.

    Attributes:
        read: Median time to the first byte of an object read, metadata read
            or permission check, seconds. Default 0.020.
        list_page: Median time to answer one list page, seconds. Default 0.060.
        write: Median time to answer a write, compose, copy, delete or
            multipart call, seconds. Default 0.040.
        bandwidth: Bytes per second for one body in each direction (the request
            body and the response body each cost ``len / bandwidth``), or
            ``None`` for unlimited. Default 200 MB/s.
        tail_p99: The 99th percentile of each class's time as a multiple of its
            median (the log-normal body's shape); 1.0 makes every request take
            exactly the median. Default 1.0.
        stall_probability: Chance that a request stalls: it waits
            ``stall_seconds`` on top of its drawn time, before the server
            applies it or after (its answer late), with equal chance.
            Default 0.
        stall_seconds: How long a stall adds, seconds. Default 0.
        seed: Seed of the draws (see :class:`LatencySampler`). Default 0.
    """

    read: float = 0.020
    list_page: float = 0.060
    write: float = 0.040
    bandwidth: float | None = 200e6
    tail_p99: float = 1.0
    stall_probability: float = 0.0
    stall_seconds: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("read", "list_page", "write", "stall_seconds"):
            value = getattr(self, name)
            if value < 0:
                raise ConfigError(f"LatencyModel.{name} must be >= 0, got {value!r}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"LatencyModel.bandwidth must be > 0, got {self.bandwidth!r}")
        if not self.tail_p99 >= 1.0:
            raise ConfigError(f"LatencyModel.tail_p99 must be >= 1, got {self.tail_p99!r}")
        if not 0.0 <= self.stall_probability <= 1.0:
            raise ConfigError(
                f"LatencyModel.stall_probability must be in [0, 1], got {self.stall_probability!r}"
            )

    @property
    def constant(self) -> bool:
        """Whether every request of a class takes the same time (no tail, no stalls)."""
        return self.tail_p99 == 1.0 and not (self.stall_probability and self.stall_seconds)

    def median(self, op: str) -> float:
        """The median time to the first byte of one request of ``op``, seconds."""
        if op in _READ_OPS:
            return self.read
        if op in _LIST_OPS:
            return self.list_page
        return self.write

    def delay(self, op: str, bytes_in: int, bytes_out: int) -> float:
        """Seconds one request of ``op`` moving these body sizes takes, at the median.

        Args:
            op: The operation name (``"get"``, ``"list"``, ``"put"``...).
            bytes_in: Size of the request body.
            bytes_out: Size of the response body.

        Returns:
            The modelled time from request to the end of the response, with the
            class's median time to the first byte (a :class:`LatencySampler`
            draws it instead).
        """
        base = self.median(op)
        if self.bandwidth is not None:
            base += (bytes_in + bytes_out) / self.bandwidth
        return base

    def to_dict(self) -> dict[str, Any]:
        """The model as JSON-able fields (the admin API's wire form)."""
        return asdict(self)


class LatencySampler:
    """Draws each request's time from a :class:`LatencyModel`, seeded.

    The server owns one per model in force; draws are taken in the order
    requests arrive, so a run with the same requests in the same order waits
    the same times (concurrent requests may arrive in another order, but the
    times drawn are the same sequence).

    Args:
        model: The model to draw from.
    """

    __slots__ = ("_rng", "_sigma", "last_stall", "model")

    def __init__(self, model: LatencyModel) -> None:
        self.model = model
        self._rng = random.Random(model.seed)
        self._sigma = math.log(model.tail_p99) / _Z99
        #: Where the last draw's stall fell, ``"before"`` or ``"after"`` the
        #: request is applied, or ``None`` (the server counts them per operation).
        self.last_stall: str | None = None

    def first_byte(self, op: str) -> float:
        """One draw of the time to the first byte of a request of ``op``, seconds."""
        before, after = self.first_byte_split(op)
        return before + after

    def first_byte_split(self, op: str) -> tuple[float, float]:
        """One draw of :meth:`first_byte`, split into the waits before and after handling.

        The server sleeps the first before it applies the request and the
        second before it answers. A stall falls on either side with equal
        chance: Google documents no place where a slow request spends its
        time, and its retry guide treats a write whose answer never came as
        possibly applied (https://cloud.google.com/storage/docs/retry-strategy),
        so a client may count neither on a slow write having taken effect nor
        on its not having. The rest of the draw comes after handling.
        """
        model = self.model
        median = model.median(op)
        rng = self._rng
        wait = median * rng.lognormvariate(0.0, self._sigma) if self._sigma else median
        self.last_stall = None
        if model.stall_probability and rng.random() < model.stall_probability:
            if rng.random() < 0.5:
                self.last_stall = "before"
                return model.stall_seconds, wait
            self.last_stall = "after"
            wait += model.stall_seconds
        return 0.0, wait

    def transfer(self, bytes_in: int, bytes_out: int) -> float:
        """Seconds the bodies take at the model's bandwidth (0 without one)."""
        bandwidth = self.model.bandwidth
        return (bytes_in + bytes_out) / bandwidth if bandwidth is not None else 0.0

    def delay(self, op: str, bytes_in: int, bytes_out: int) -> float:
        """One draw of :meth:`LatencyModel.delay`: a drawn first byte plus the transfer."""
        return self.first_byte(op) + self.transfer(bytes_in, bytes_out)


#: ``same-region-tail``: the medians of ``same-region`` with a tail and stalls.
#:
#: Shape and why:
#:
#: - Body: log-normal around the same medians as ``same-region`` (read 20 ms,
#:   list page 60 ms, write 40 ms), p99 = 5x the median (so p95 ~3.1x, p90
#:   ~2.5x; the mean is 1.27x the median). GCS's support team, asked about a
#:   client's read latencies, called p50 62 ms, p90 136 ms, p99 191-320 ms
#:   "in line with what we expect" (a p99 of 3-5x the median):
#:   https://github.com/googleapis/google-cloud-dotnet/issues/882 . A
#:   measurement of 10 million S3 part uploads gave p50 80 ms and p95 880 ms
#:   (heavier still): https://cloudsqale.com/2020/06/04/s3-low-latency-writes-using-aggressive-retries-to-get-consistent-latency-request-timeouts/
#: - Stalls: 1 request in 1,000 waits 2 s more (p99.9 is a stall). The same
#:   S3 measurement had 0.26% of requests over 5 s and 0.16% over 10 s; S3's
#:   own guide tells latency-sensitive clients to track slow requests and
#:   retry them, a small GET "after 2 seconds", and large ones in their
#:   slowest 5%: https://docs.aws.amazon.com/whitepapers/latest/s3-optimizing-performance-best-practices/timeouts-and-retries-for-latency-sensitive-applications.html ;
#:   Google's C++ client added read hedging for "20s+ stalls" under network
#:   congestion: https://github.com/googleapis/google-cloud-cpp/pull/16344 .
#:   2 s is the short end of that: enough to hold a batch of 64 GETs hostage
#:   (with 1 stall in 1,000 requests, 6% of such batches meet one), short
#:   enough that a benchmark of a few thousand requests sees several.
#: - Why it matters: a batch that waits for its slowest request sees the tail
#:   of the maximum of its requests ("The Tail at Scale", Dean and Barroso,
#:   CACM 2013, https://research.google/pubs/pub40801/), whose remedy, a
#:   hedged second request after the 95th percentile, is what
#:   ``GCSConfig.hedge`` does.
#:
#: Bandwidth (200 MB/s per body) has no tail here.
SAME_REGION_TAIL = LatencyModel(tail_p99=5.0, stall_probability=0.001, stall_seconds=2.0)

#: Named latency presets. "same-region" is close to a bucket in the VM's region,
#: every request of a class taking exactly its median; "same-region-tail" adds
#: a tail and rare stalls (see :data:`SAME_REGION_TAIL`).
PRESETS: dict[str, LatencyModel] = {
    "same-region": LatencyModel(),
    "same-region-tail": SAME_REGION_TAIL,
}


def resolve_latency(latency: str | LatencyModel | dict[str, Any] | None) -> LatencyModel | None:
    """Turn a preset name, a model, its dict form or ``None`` into a model.

    Args:
        latency: ``None`` (no latency), a preset name from :data:`PRESETS`,
            a :class:`LatencyModel` or the dict of its fields.

    Returns:
        The model, or ``None`` for no modelled latency.

    Raises:
        ConfigError: Unknown preset name or bad field values.
    """
    if latency is None or isinstance(latency, LatencyModel):
        return latency
    if isinstance(latency, str):
        if latency in ("none", ""):
            return None
        try:
            return PRESETS[latency]
        except KeyError:
            raise ConfigError(
                f"unknown latency preset {latency!r}; known: {sorted(PRESETS)} or 'none'"
            ) from None
    if isinstance(latency, dict):
        try:
            return LatencyModel(**latency)
        except TypeError as exc:
            raise ConfigError(f"bad latency model fields {sorted(latency)}: {exc}") from exc
    raise ConfigError(f"latency must be None, a preset name or a LatencyModel, got {latency!r}")


class RateCap:
    """A token bucket: at most ``rate`` requests per second, bursts of ``rate``.

    Args:
        rate: Requests per second allowed, > 0.
    """

    __slots__ = ("_last", "_tokens", "rate")

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ConfigError(f"rps cap must be > 0, got {rate!r}")
        self.rate = float(rate)
        self._tokens = max(1.0, self.rate)
        self._last = time.monotonic()

    def take(self) -> float:
        """Take one token.

        Returns:
            0.0 when the request may proceed, else the seconds until a token
            will be available (the request is refused).
        """
        now = time.monotonic()
        burst = max(1.0, self.rate)
        self._tokens = min(burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate
