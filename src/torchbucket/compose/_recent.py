"""Recent durations of one kind of compose work, per bucket, and when one straggles.

Shared by the compose path's read-around (``_fetch.py``) and the composite
delete's resend (``registry.py``): both wait ``factor`` x the median of the
process's recent durations on that bucket, at least ``floor`` seconds.
"""

from __future__ import annotations

import collections

__all__ = ["RecentTimes"]

# Nothing measured yet on a bucket: a compose path or a delete takes tens of
# milliseconds at the median, a stall seconds; the first of a worker's
# requests start all at once, so there is no median to wait for.
_UNMEASURED_S = 0.5


class RecentTimes:
    """The last ``keep`` durations per bucket URI (used from the runtime's loop only).

    Args:
        keep: Durations remembered per bucket.
    """

    __slots__ = ("_keep", "_times")

    def __init__(self, keep: int = 64) -> None:
        self._keep = keep
        self._times: dict[str, collections.deque[float]] = {}

    def add(self, key: str, seconds: float) -> None:
        """Remember one duration on bucket ``key``."""
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = collections.deque(maxlen=self._keep)
        times.append(seconds)

    def measured(self, key: str) -> bool:
        """Whether a duration on bucket ``key`` is known."""
        return bool(self._times.get(key))

    def straggling_after(self, key: str, factor: float, floor: float) -> float:
        """Seconds after which work on ``key`` counts as straggling.

        ``factor`` x the median of the recent durations, at least ``floor``;
        ``max(floor, 0.5)`` before any is known.
        """
        times = self._times.get(key)
        if not times:
            return max(floor, _UNMEASURED_S)
        median = sorted(times)[len(times) // 2]
        return max(floor, factor * median)
