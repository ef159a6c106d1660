"""Cloud latency, bandwidth and a requests-per-second cap, modelled with sleeps.

Every sleep is an ``asyncio.sleep`` on the server's loop, so a modelled delay
never blocks other requests: many requests in flight overlap their latency as
they would against a real bucket.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from torchbucket.errors import ConfigError

__all__ = ["PRESETS", "LatencyModel", "RateCap", "resolve_latency"]

# Operation -> which latency figure applies.
_READ_OPS = frozenset({"get", "head", "iam", "bucket_get", "mpu_parts"})
_LIST_OPS = frozenset({"list", "mpu_list", "bucket_list"})


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyModel:
    """Latency and bandwidth per operation class.

    Attributes:
        read: Time to the first byte of an object read, metadata read or
            permission check, seconds. Default 0.020.
        list_page: Time to answer one list page, seconds. Default 0.060.
        write: Time to answer a write, compose, copy, delete or multipart
            call, seconds. Default 0.040.
        bandwidth: Bytes per second for one body in each direction (the request
            body and the response body each cost ``len / bandwidth``), or
            ``None`` for unlimited. Default 200 MB/s.
    """

    read: float = 0.020
    list_page: float = 0.060
    write: float = 0.040
    bandwidth: float | None = 200e6

    def __post_init__(self) -> None:
        for name in ("read", "list_page", "write"):
            value = getattr(self, name)
            if value < 0:
                raise ConfigError(f"LatencyModel.{name} must be >= 0, got {value!r}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"LatencyModel.bandwidth must be > 0, got {self.bandwidth!r}")

    def delay(self, op: str, bytes_in: int, bytes_out: int) -> float:
        """Seconds one request of ``op`` moving these body sizes takes.

        Args:
            op: The operation name (``"get"``, ``"list"``, ``"put"``...).
            bytes_in: Size of the request body.
            bytes_out: Size of the response body.

        Returns:
            The modelled time from request to the end of the response.
        """
        if op in _READ_OPS:
            base = self.read
        elif op in _LIST_OPS:
            base = self.list_page
        else:
            base = self.write
        if self.bandwidth is not None:
            base += (bytes_in + bytes_out) / self.bandwidth
        return base

    def to_dict(self) -> dict[str, Any]:
        """The model as JSON-able fields (the admin API's wire form)."""
        return asdict(self)


#: Named latency presets. "same-region" is close to a bucket in the VM's region.
PRESETS: dict[str, LatencyModel] = {
    "same-region": LatencyModel(),
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
