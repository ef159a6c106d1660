"""Hedged reads: a second request for a read much slower than its recent peers.

Why: a batch of 64 objects finishes with its slowest GET, and an object store
has a tail (a few percent of requests take several times the median, a rare
one stalls for seconds). "The Tail at Scale" (Dean and Barroso, CACM 2013,
https://research.google/pubs/pub40801/) sends a second request once the first
has taken longer than the 95th percentile of its kind: in their Bigtable
benchmark, after 10 ms, the 99.9th percentile of reading 1,000 keys went from
1,800 ms to 74 ms for 2% more requests. S3's guide for latency-sensitive
clients says the same in its terms: track slow requests and retry them
(https://docs.aws.amazon.com/whitepapers/latest/s3-optimizing-performance-best-practices/timeouts-and-retries-for-latency-sensitive-applications.html),
and Google's C++ client races delayed duplicate reads
(https://docs.cloud.google.com/cpp/docs/reference/storage/latest/structgoogle_1_1cloud_1_1storage__experimental_1_1EnableReadHedgingOption).

How: a :class:`Hedger` per process and endpoint keeps the times of the recent
successful reads per size class (the requested length's power of two; whole
objects of unknown length are one class) and a budget. A read runs inline in
its task with one timer: when the timer fires (``factor`` x the ``quantile``
of its class, at least ``floor``) and the budget has a hedge to spend, a second
request starts in a task of its own. The first success wins: a spare that
wins cancels the first request's task (its connection is closed, so a
cancelled in-place read never writes into the buffer again) and hands its
answer over; a first request that wins cancels the spare. If one fails, the
other may still answer; if both fail, the first one's error goes to the
retries around the read (see docs/reliability.md). Both requests are whole
attempts, verified as any read is.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from torchbucket.config import HedgeConfig
from torchbucket.runtime import accounting
from torchbucket.storage.batch import current_batch

__all__ = ["Hedger", "get_hedger"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
S = TypeVar("S")

# The wait of a size class is recomputed after this many new samples.
_REFRESH = 32
# Until a size class's quantile is known, reads shorter than this (or of
# unknown length) wait HedgeConfig.initial_wait; longer ones (a checkpoint's
# ranges, a large sample), whose time depends on bandwidth and load, wait that
# plus their length at _INITIAL_BYTES_PER_S, a pace well below one stream's.
# Before, a longer read was not hedged until 32 of its class had answered: a
# DataLoader worker starts a new Hedger every epoch, and on the emulator's
# same-region-tail model (seed 0: the 105th request stalls 2 s) the first
# batch of 1 MiB samples came 1.3-2.3 s late, every epoch.
_SMALL = 1 << 20
_INITIAL_BYTES_PER_S = 25e6


class _SizeClass:
    """Recent read times of one size class and the hedging wait they give."""

    __slots__ = ("fresh", "pos", "samples", "wait")

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.pos = 0
        self.fresh = 0
        #: Seconds before a read of the class is hedged; ``None`` until known.
        self.wait: float | None = None

    def add(self, seconds: float, config: HedgeConfig) -> None:
        samples = self.samples
        if len(samples) < config.window:
            samples.append(seconds)
        else:
            samples[self.pos] = seconds
            self.pos = (self.pos + 1) % config.window
        self.fresh += 1
        if len(samples) >= config.min_samples and (self.wait is None or self.fresh >= _REFRESH):
            self.fresh = 0
            ordered = sorted(samples)
            quantile = ordered[min(len(ordered) - 1, int(config.quantile * len(ordered)))]
            self.wait = max(config.floor, quantile * config.factor)


class _Race(Generic[S]):
    """One hedged read's timer and spare request."""

    __slots__ = (
        "hedger",
        "make_spare",
        "over",
        "result",
        "sent",
        "spare",
        "started",
        "task",
        "timer",
        "wait",
        "won",
    )

    def __init__(
        self,
        hedger: Hedger,
        make_spare: Callable[[], Awaitable[S]],
        task: asyncio.Task[Any],
        wait: float,
        started: float,
    ) -> None:
        self.hedger = hedger
        self.make_spare = make_spare
        self.task = task
        self.wait = wait
        self.started = started
        self.timer: asyncio.TimerHandle | None = None
        self.spare: asyncio.Task[S] | None = None
        self.won = False
        self.over = False
        self.sent = False
        self.result: S | None = None

    def launch(self) -> None:
        """The timer fired: send the spare request if the budget allows.

        With the budget spent (a burst of slow reads took it), the read asks
        again after another wait: the longer it runs, the likelier it is
        stalled, and each new read adds to the budget. Before, such a read
        was never hedged: with ``factor=1.0`` on the emulator's
        ``same-region-tail``, a slow patch spent the burst and a 2 s stall
        behind it went unhedged.
        """
        self.timer = None
        if self.over:
            return
        if not self.hedger.spend():
            self.timer = asyncio.get_running_loop().call_later(self.wait, self.launch)
            return
        self.spare = spare = asyncio.ensure_future(self._send())
        spare.add_done_callback(self._spare_done)

    def elapsed(self) -> float:
        """Seconds since the read began."""
        return asyncio.get_running_loop().time() - self.started

    def hurry(self, after: float) -> None:
        """Hedge once the read has run ``after`` seconds (at least ``floor``), if sooner.

        Called by the read's :class:`~torchbucket.storage.batch.ReadBatch` when
        it is one of the batch's last stragglers.
        """
        if self.over or self.spare is not None or self.timer is None:
            return
        loop = asyncio.get_running_loop()
        when = self.started + max(self.hedger.config.floor, after)
        if when >= self.timer.when():
            return
        self.timer.cancel()
        self.timer = loop.call_at(max(when, loop.time()), self.launch)

    async def _send(self) -> S:
        # Counted once it runs: a read that answered meanwhile cancels it unsent.
        self.sent = True
        self.hedger.count()
        return await self.make_spare()

    def _spare_done(self, spare: asyncio.Task[S]) -> None:
        if spare.cancelled():
            if not self.sent:
                self.hedger.refund()
            return
        error = spare.exception()  # retrieved, so a lost spare's error is never logged
        if error is not None or self.over:
            return
        self.result = spare.result()
        self.won = True
        self.task.cancel()  # the first request stops where it waits

    def finish(self) -> None:
        """The read is over: no timer, no spare."""
        self.over = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.spare is not None and not self.spare.done():
            self.spare.cancel()

    def settle(self) -> None:
        """Take back the cancellation the spare's win sent to the read's task.

        Raises:
            asyncio.CancelledError: The task was also cancelled from outside.
        """
        # Before 3.11 a task keeps no count of cancellations: nothing to take back.
        if sys.version_info >= (3, 11) and self.task.uncancel() > 0:
            raise asyncio.CancelledError


class Hedger:
    """Times of recent reads per size class and the budget of hedges, for one endpoint.

    Args:
        config: When to hedge and how many.
    """

    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self._classes: dict[int, _SizeClass] = {}
        # A new process (a DataLoader worker, every epoch) starts with the
        # burst: its first reads may be hedged, as a long-lived one's are.
        self._tokens = config.burst
        #: Reads run through :meth:`run` and hedges sent (this process).
        self.reads = 0
        self.hedges = 0

    def spend(self) -> bool:
        """Take one hedge from the budget, if there is one."""
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def refund(self) -> None:
        """Give back a hedge that was never sent."""
        self._tokens = min(self.config.burst, self._tokens + 1.0)

    def count(self) -> None:
        """Count one hedge sent."""
        self.hedges += 1
        accounting.hedged()

    def wait_for(self, nbytes: int | None) -> float | None:
        """Seconds before a read of ``nbytes`` (``None``: a whole object) is hedged."""
        size_class = self._classes.get(0 if nbytes is None else nbytes.bit_length())
        return None if size_class is None else size_class.wait

    async def run(
        self,
        first: Callable[[], Awaitable[T]],
        spare: Callable[[], Awaitable[S]],
        adopt: Callable[[S], T],
        nbytes: int | None,
    ) -> T:
        """Run the read ``first``; hedge it with ``spare`` if it is slow.

        Args:
            first: One attempt of the read.
            spare: Another attempt of the same read, which must not touch what
                ``first`` writes to.
            adopt: Turns the spare's result into the read's, once ``first`` has
                stopped (a read into a buffer copies the spare's bytes there).
            nbytes: The length asked for, or ``None`` for a whole object.

        Returns:
            The first successful attempt's result.

        Raises:
            Exception: ``first``'s error, when the spare did not succeed either.
        """
        config = self.config
        self.reads += 1
        self._tokens = min(config.burst, self._tokens + config.budget)
        key = 0 if nbytes is None else nbytes.bit_length()
        size_class = self._classes.get(key)
        if size_class is None:
            size_class = self._classes[key] = _SizeClass()
        loop = asyncio.get_running_loop()
        started = loop.time()
        wait = size_class.wait
        if wait is None:
            wait = config.initial_wait
            if nbytes is not None and nbytes >= _SMALL:
                wait += nbytes / _INITIAL_BYTES_PER_S
        task = asyncio.current_task()
        race: _Race[S] | None = None
        if (
            wait is not None
            and task is not None
            and (nbytes is None or nbytes <= config.max_read_size)
        ):
            race = _Race(self, spare, task, wait, started)
            race.timer = loop.call_later(wait, race.launch)
        batch = current_batch()
        batch_key = 0 if batch is None else batch.begin(None if race is None else race.hurry)
        answered: float | None = None
        try:
            result = await self._first(race, first, adopt)
            answered = loop.time() - started
            size_class.add(answered, config)
            return result
        finally:
            if batch is not None:
                batch.end(batch_key, answered)

    async def _first(
        self,
        race: _Race[S] | None,
        first: Callable[[], Awaitable[T]],
        adopt: Callable[[S], T],
    ) -> T:
        """The read's result: ``first``'s, or its spare's when that answers first."""
        if race is None:
            return await first()
        try:
            result = await first()
        except asyncio.CancelledError:
            race.finish()
            if not race.won:
                raise
            race.settle()
            logger.debug("hedged read won after %.3f s", race.elapsed())
            return adopt(race.result)  # type: ignore[arg-type]
        except Exception:
            outcome = await _spare_outcome(race)
            if outcome is None:
                raise
            return adopt(outcome[0])
        race.finish()
        return result


async def _spare_outcome(race: _Race[S]) -> tuple[S] | None:
    """After the first request failed: the spare's result, if it succeeds."""
    if race.won:
        # The spare won as the first request failed: take back the cancellation.
        race.over = True
        race.settle()
        return (race.result,)  # type: ignore[return-value]
    spare = race.spare
    race.over = True
    if race.timer is not None:
        race.timer.cancel()
        race.timer = None
    if spare is None:
        return None
    try:
        return (await spare,)
    except asyncio.CancelledError:
        spare.cancel()
        raise
    except Exception:
        return None


_hedgers: dict[tuple[str, HedgeConfig], Hedger] = {}


def get_hedger(endpoint: str, config: HedgeConfig) -> Hedger | None:
    """The process's hedger for ``endpoint`` and ``config``; ``None`` when hedging is off."""
    if not config.enabled:
        return None
    key = (endpoint, config)
    hedger = _hedgers.get(key)
    if hedger is None:
        hedger = _hedgers[key] = Hedger(config)
    return hedger
