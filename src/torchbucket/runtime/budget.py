"""A job-wide request budget: every process of a training job shares one rate per bucket.

GCS gives a bucket a request capacity (about 5,000 object reads and 1,000
writes per second to start), grows it when load near it is sustained, and asks
clients to ramp up gradually, doubling no faster than every 20 minutes
(https://cloud.google.com/storage/docs/request-rate). A job of N nodes x 8
ranks x 8 DataLoader workers is thousands of processes; each one's own AIMD
limit (:class:`~torchbucket.runtime.retry.AdaptiveLimiter`) learns the
bucket's limit from its own 429s, all of them starting at full speed. The
budget makes the job one client instead:

- **one rate per job** (:class:`RateController`): it starts at 0.9 of
  ``BudgetConfig.read_rate`` / ``write_rate`` (a new bucket's documented
  rate; reads and writes apart, as GCS counts them), grows while the job
  uses it and nothing is throttled, doubling every ``doubling`` seconds
  (GCS's guidance; near the rate of the last throttle 4-16 times slower),
  and on a throttle falls to 0.9 of itself (or just under what the bucket
  admitted, when that is much lower);
- **ranks share what they learn** through torch.distributed's store: every
  tick (``interval``, longer for large worlds: :meth:`BudgetConfig.tick`; on
  ticks of the wall clock, so ranks step together) each rank adds the
  attempts and the throttled answers of its processes to two job-wide
  counters per class (``TCPStore.add``: one round trip each, which also
  returns the job's total), reads a count of idle ranks, and rank 0's rate.
  Every rank runs the same controller on the same totals and adopts rank
  0's rate while rank 0 publishes it (ranks reading at slightly different
  moments drift apart otherwise), so one rank's 429 slows the whole job at
  the next tick, and a rank 0 that dies leaves every rank its own. A rank
  spends the rate over the ranks not idle (a rank that ends gives its share
  back; one that dies keeps it);
- **a rank's processes share one token bucket** (:class:`Budget`): a small
  file in shared memory (``/dev/shm``), a GCRA cell per class under ``flock``,
  that the rank's DataLoader workers (fork or spawn: they find it through
  ``$TORCHBUCKET_BUDGET_DIR``) take from before each attempt, sleeping until
  their turn.

Failure: the controller runs in a daemon thread of the process that made the
segment (the rank's main process) and stamps a heartbeat at each tick. A
store that fails or does not answer within ``store_timeout`` turns the rank
to local mode (its own processes' signals, scaled to the job); a heartbeat
older than ``stale_after`` seconds (a wedged or dead controller) makes every
process skip the budget, leaving the per-process AIMD limit, which is always
in force. Nothing a request waits on can block on the store.

Turned on by ``GCSConfig(budget=BudgetConfig(enabled=True))`` or
``$TORCHBUCKET_BUDGET`` (``1``, or a JSON object of :class:`BudgetConfig`
fields; ``0`` turns it off, whatever the config says).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import mmap
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from torchbucket._checks import check_config, number, seconds, switch
from torchbucket.errors import ConfigError

__all__ = ["Budget", "BudgetConfig", "RateController", "budget_class", "job_budget", "status"]

logger = logging.getLogger(__name__)

ENV = "TORCHBUCKET_BUDGET"
DIR_ENV = "TORCHBUCKET_BUDGET_DIR"
CLASSES = ("read", "write")
_WRITE_WORDS = (
    *("put", "upload", "compose", "copy", "rewrite", "delete"),
    *("multipart", "create", "patch", "move", "resumable"),
)


def budget_class(operation: str) -> int:
    """0 (read) or 1 (write): how GCS counts a request named ``operation``."""
    return 1 if any(w in operation for w in _WRITE_WORDS) else 0


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetConfig:
    """The job-wide request budget (see :mod:`torchbucket.runtime.budget`).

    Attributes:
        enabled: Whether requests spend from the budget. Default ``False``.
        read_rate: A new bucket's object reads per second (GCS: 5,000, the
            default); the job starts at 0.9 of it and probes above it slowly.
        write_rate: The same for writes. Default 1,000.
        doubling: Seconds the ramp takes to double the rate. Default 1,200
            (GCS: "double the request rate no faster than every 20 minutes").
        interval: Seconds between two exchanges of signals. Default 0.25.
        store_ops: Store requests per second the whole job may send; the
            interval grows with the world size to stay under it. Default 20,000.
        store_timeout: Seconds a store request may take before the rank
            falls back to local mode. Default 2.
        stale_after: Seconds without a controller tick after which processes
            skip the budget. Default 5.
        minimum_rate: Floor of the job's rate per class. Default 1.
    """

    enabled: bool = switch(False)
    read_rate: float = number(5000.0, above=0)
    write_rate: float = number(1000.0, above=0)
    doubling: float = seconds(1200.0, positive=True)
    interval: float = seconds(0.25, positive=True)
    store_ops: float = number(20000.0, above=0)
    store_timeout: float = seconds(2.0, positive=True)
    stale_after: float = seconds(5.0, positive=True)
    minimum_rate: float = number(1.0, above=0)

    def __post_init__(self) -> None:
        check_config(self)

    def resolved(self) -> BudgetConfig:
        """This config, or what ``$TORCHBUCKET_BUDGET`` says instead."""
        raw = os.environ.get(ENV, "").strip()
        if not raw:
            return self
        if raw in ("0", "off", "false"):
            return BudgetConfig(enabled=False)
        if raw in ("1", "on", "true"):
            return BudgetConfig(enabled=True)
        try:
            return BudgetConfig(**{"enabled": True, **json.loads(raw)})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"${ENV} must be 0, 1 or JSON BudgetConfig fields: {exc}") from exc

    def tick(self, world: int) -> float:
        """Seconds between exchanges for ``world`` ranks (up to four store requests per
        class each: the idle count, attempts, throttles, rank 0's rate)."""
        return max(self.interval, 4.0 * len(CLASSES) * world / self.store_ops)


class RateController:
    """The job's rate for one request class: ramp, hold, cut (pure; time passed in).

    - Cut: on a tick with throttled answers, the rate falls to 0.9 of itself
      (the same on every rank), or, when the bucket admitted much less lately
      (an average over about 2 s), to 0.95 of that, not below half the rate;
      the rate before the cut is remembered
      as the ceiling. The next tick's throttles are not counted again (they
      answer requests sent before the cut).
    - Ramp: on a tick without throttles in which the job used at least 0.8 of
      its rate, the rate grows by a factor 2 per ``doubling`` seconds; twice
      as fast below 0.9 of the ceiling (back to what was served), four times
      slower up to 1.05 of it (probing; slower still, up to 16 times, after
      each throttle at the same ceiling), at the normal pace above (the
      bucket has grown: the ceiling is forgotten).

    Args:
        initial: The bucket's starting capacity as documented, requests per
            second: the rate starts at ``margin`` of it, with it as the ceiling.
        doubling: Seconds per doubling while the job uses its rate untroubled.
        minimum: Floor of the rate.
        margin: Fraction of ``initial`` to start at.
    """

    #: Growth near the rate of the last throttle is this many times slower.
    CAREFUL = 4.0
    #: Each throttle at the same ceiling (within 10%) halves the probing pace
    #: again, down to this many times slower still: a steady bucket is probed
    #: less and less often.
    PATIENCE = 4.0
    #: Growth back up to 0.9 of that rate is this many times faster.
    RECOVER = 2.0

    def __init__(
        self, initial: float, *, doubling: float, minimum: float = 1.0, margin: float = 0.9
    ) -> None:
        # A bucket starts at "around" its documented rate: begin a margin under
        # it, and probe above it carefully, as above the rate of a throttle.
        self.rate = float(initial) * margin
        self.doubling = doubling
        self.minimum = minimum
        self.ceiling: float | None = float(initial)  # the rate when last throttled
        self.admitted: float | None = None  # the admitted rate, averaged over ~2 s
        self.cuts = 0
        self._last: float | None = None
        self._held = False  # the tick after a cut: its throttles were already answered
        self._patience = 1.0  # probing slows down while the ceiling holds

    def update(self, now: float, sent: float, throttled: float) -> float:
        """One tick: ``sent`` attempts since the last, ``throttled`` of them refused.

        Returns:
            The new rate.
        """
        last, self._last = self._last, now
        if last is None or now <= last:
            return self.rate
        dt = now - last
        admitted = max(0.0, sent - throttled) / dt
        weight = min(1.0, dt / 2.0)
        avg = self.admitted
        self.admitted = avg = admitted if avg is None else avg + weight * (admitted - avg)
        if throttled > 0 and not self._held:
            last = self.ceiling
            if last is not None and abs(self.rate / last - 1.0) < 0.1:
                self._patience = min(self._patience * 2.0, self.PATIENCE)
            else:
                self._patience = 1.0
            self.ceiling = self.rate
            # 0.9 of the rate, the same on every rank; lower only when the bucket
            # admitted much less (a rate far above it), down to half.
            cut = 0.9 * self.rate
            if 0.95 * avg < 0.8 * self.rate:
                cut = max(0.95 * avg, 0.5 * self.rate)
            self.rate = max(self.minimum, cut)
            self.cuts += 1
            self._held = True
            return self.rate
        self._held = False
        # Used: this tick's attempts, or the ~2 s average when a tick reads
        # noisy (ranks' additions interleave with this rank's reads).
        if throttled == 0 and max(sent / dt, avg) >= 0.8 * self.rate:
            growth = math.log(2.0) / self.doubling
            ceiling = self.ceiling
            if ceiling is not None:
                if self.rate < 0.9 * ceiling:
                    growth *= self.RECOVER
                elif self.rate < 1.05 * ceiling:
                    growth /= self.CAREFUL * self._patience
                else:
                    self.ceiling = None
                    self._patience = 1.0
            self.rate *= math.exp(growth * dt)
        return self.rate


# Segment layout (float64 cells): header, then one row per class.
_H_MAGIC, _H_BEAT, _H_WORLD, _H_MODE, _H_OWNER = range(5)
_HEAD = 8
_C_RATE, _C_TAT, _C_SENT, _C_THROTTLED, _C_WAITED, _C_JOB_RATE, _C_JOB_THROTTLED = range(7)
_ROW = 8
_CELLS = _HEAD + _ROW * len(CLASSES)
_MAGIC = 41.0
_BURST_S = 0.2
#: How far ahead a process may book its turn, seconds.
AHEAD_S = 0.25
MODES = ("off", "local", "job")


class _Segment:
    """The shared file of one bucket's budget, mapped; opened again after a fork."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pid = -1
        self._fd = -1
        self.cells: memoryview[float] | None = None

    def open(self) -> memoryview[float]:
        if self._pid == os.getpid() and self.cells is not None:
            return self.cells
        # Each process needs its own open file: flock belongs to the open file,
        # which a forked child would otherwise share with its parent.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_size < _CELLS * 8:
                os.ftruncate(fd, _CELLS * 8)
            cells = memoryview(mmap.mmap(fd, _CELLS * 8)).cast("d")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._fd, self._pid, self.cells = fd, os.getpid(), cells
        return cells

    @contextlib.contextmanager
    def locked(self) -> Any:
        cells = self.open()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield cells
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


class Budget:
    """One bucket's budget as a process of a rank sees it (see the module docstring).

    Args:
        segment: The rank's shared cells for this bucket.
        config: The budget's settings.
    """

    def __init__(self, segment: _Segment, config: BudgetConfig) -> None:
        self.segment = segment
        self.config = config

    def take(self, cls: int) -> float:
        """Spend one request of class ``cls``: the seconds to wait before sending it.

        A turn is booked at most :data:`AHEAD_S` seconds ahead, so that a new
        rate applies within that time; beyond it nothing is booked and the
        answer is negative: sleep ``-answer`` seconds and ask again
        (:meth:`turn` does both). 0 when the controller is not ticking (a
        stale heartbeat): the budget is then skipped, and the per-process
        limit alone applies.
        """
        with self.segment.locked() as c:
            if c[_H_MODE] == 0 or time.time() - c[_H_BEAT] > self.config.stale_after:
                return 0.0
            row = _HEAD + _ROW * cls
            now = time.monotonic()
            tat = max(c[row + _C_TAT], now)
            wait = float(tat - now - _BURST_S)
            if wait > AHEAD_S:
                c[row + _C_WAITED] += wait - AHEAD_S
                return AHEAD_S - wait
            c[row + _C_TAT] = tat + 1.0 / c[row + _C_RATE]
            c[row + _C_SENT] += 1
            if wait > 0:
                c[row + _C_WAITED] += wait
                return wait
            return 0.0

    async def turn(self, cls: int) -> None:
        """Wait for this process's turn to send one request of class ``cls``."""
        while True:
            wait = self.take(cls)
            if wait >= 0:
                if wait:
                    await asyncio.sleep(wait)
                return
            await asyncio.sleep(-wait)

    def throttled(self, cls: int) -> None:
        """Record a 429/503 answer of class ``cls``."""
        with self.segment.locked() as c:
            c[_HEAD + _ROW * cls + _C_THROTTLED] += 1

    def status(self) -> dict[str, Any]:
        """This rank's view: mode, world, and per class its rate, the job's, counts."""
        c = self.segment.open()
        stale = time.time() - c[_H_BEAT] > self.config.stale_after
        out: dict[str, Any] = {
            "mode": "off" if stale else MODES[int(c[_H_MODE])],
            "world": int(c[_H_WORLD]),
        }
        for i, name in enumerate(CLASSES):
            row = _HEAD + _ROW * i
            out[name] = {
                "rank_rate": round(c[row + _C_RATE], 3),
                "job_rate": round(c[row + _C_JOB_RATE], 3),
                "sent": int(c[row + _C_SENT]),
                "throttled": int(c[row + _C_THROTTLED]),
                "job_throttled": int(c[row + _C_JOB_THROTTLED]),
                "waited_s": round(c[row + _C_WAITED], 3),
            }
        return out


_budgets: dict[tuple[int, str], Budget | None] = {}
_syncs: list[Any] = []
_dir_lock = threading.Lock()


_DIR_PREFIX = "torchbucket-budget-"


def _segment_dir() -> str:
    """This rank's directory of segments, made (and exported) on first use.

    The process that makes it removes it when it exits, a DataLoader worker
    too (``multiprocessing`` runs its finalizers, not ``atexit``); one that
    was killed leaves it, so each new directory first removes those of
    processes that no longer run.
    """
    path = os.environ.get(DIR_ENV)
    if path and os.path.isdir(path):
        return path
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    _remove_orphans(base)
    path = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=base)
    os.environ[DIR_ENV] = path
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)

    import atexit
    import multiprocessing.util

    atexit.register(remove)
    multiprocessing.util.Finalize(None, remove, exitpriority=0)
    return path


def _remove_orphans(base: str) -> None:
    """Remove the segment directories whose maker no longer runs (killed, never cleaned)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(_DIR_PREFIX):
            continue
        pid_text = name[len(_DIR_PREFIX) :].partition("-")[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def job_budget(bucket: str, config: BudgetConfig) -> Budget | None:
    """The budget of ``bucket`` in this process, or ``None`` when it is off."""
    key = (os.getpid(), bucket)
    if key in _budgets:
        return _budgets[key]
    resolved = config.resolved()
    if not resolved.enabled:
        _budgets[key] = None
        return None
    with _dir_lock:
        if key in _budgets:
            return _budgets[key]
        name = hashlib.sha1(bucket.encode(), usedforsecurity=False).hexdigest()[:16]
        segment = _Segment(os.path.join(_segment_dir(), name))
        cells = segment.open()
        if cells[_H_MAGIC] != _MAGIC:  # nobody runs this segment's controller yet: we do
            from torchbucket.runtime._budget_sync import Sync

            sync = Sync(segment, resolved, bucket)
            sync.start()
            _syncs.append(sync)
        budget = _budgets[key] = Budget(segment, resolved)
    return budget


def status() -> dict[str, dict[str, Any]]:
    """Every budget this process spends from, by bucket (empty when off)."""
    pid = os.getpid()
    return {b: budget.status() for (p, b), budget in _budgets.items() if p == pid and budget}
