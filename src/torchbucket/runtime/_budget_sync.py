"""The controller thread of one rank's budget: local signals, the job's store, the rates.

See :mod:`torchbucket.runtime.budget` for the design. One thread per segment
(bucket) in the process that made it; it never holds the segment's lock while
it talks to the store.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

from torchbucket.runtime.budget import (
    _C_JOB_RATE,
    _C_JOB_THROTTLED,
    _C_RATE,
    _C_SENT,
    _C_TAT,
    _C_THROTTLED,
    _H_BEAT,
    _H_MAGIC,
    _H_MODE,
    _H_OWNER,
    _H_WORLD,
    _HEAD,
    _MAGIC,
    _ROW,
    CLASSES,
    BudgetConfig,
    RateController,
    _Segment,
)

__all__ = ["Sync"]

logger = logging.getLogger("torchbucket.runtime.budget")

#: Ticks in a row without requests after which a rank counts itself idle.
IDLE_TICKS = 8
#: Ticks without a new rate from rank 0 after which a rank uses its own.
LEADER_TICKS = 8
#: A published rate is ``round(rate * 1000) * _TICKS + tick % _TICKS``.
_TICKS = 4096


class Sync:
    """The controller thread of one segment: local signals, the store, the rates."""

    def __init__(self, segment: _Segment, config: BudgetConfig, bucket: str) -> None:
        self.segment = segment
        self.config = config
        self.key = f"torchbucket/budget/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{bucket}"
        initial = (config.read_rate, config.write_rate)
        self.controllers = [
            RateController(r, doubling=config.doubling, minimum=config.minimum_rate)
            for r in initial
        ]
        self._local = [0.0] * (2 * len(CLASSES))  # last sent, throttled per class
        self._job: dict[int, float] = {}  # the job's counters when last read
        self._idle = False  # whether this rank counts itself idle in the job's counter
        self._quiet = 0  # ticks in a row without requests
        self.idle = 0  # ranks of the job that count themselves idle, at the last tick
        self.rank = 0
        self._ticks = 0
        n = len(CLASSES)
        self._published = [0] * n  # rank 0: the code it last published per class
        self._seen: list[int | None] = [None] * n  # the others: rank 0's last tick seen
        self._stale = [0] * n
        self.leader: list[float | None] = [None] * n  # rank 0's rate, while it publishes
        self._store: Any = None
        self._store_failed = False
        self.world = 1
        self.stop = threading.Event()

    def start(self) -> None:
        with self.segment.locked() as c:
            c[_H_MAGIC], c[_H_OWNER], c[_H_WORLD], c[_H_MODE] = _MAGIC, os.getpid(), 1, 1
            for i, ctl in enumerate(self.controllers):
                c[_HEAD + _ROW * i + _C_RATE] = ctl.rate
                c[_HEAD + _ROW * i + _C_JOB_RATE] = ctl.rate
            c[_H_BEAT] = time.time()
        self._thread = threading.Thread(target=self._run, name="torchbucket-budget", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the thread and let its store client go (at exit: a thread still
        inside a store call when the interpreter ends aborts the process)."""
        self.stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.config.store_timeout + 1.0)
        store, self._store = self._store, None
        if store is not None and not self._idle and not self._thread.is_alive():
            # A rank that ends gives its share back (one that dies keeps it).
            try:
                store.add(f"{self.key}/idle", 1)
            except Exception:  # at exit, there is nothing to fall back to
                pass

    def _run(self) -> None:
        while not self.stop.is_set():
            tick = self.config.tick(self.world)
            now = time.time()
            if self.stop.wait(tick - now % tick):  # on the wall clock's ticks: ranks step together
                break
            try:
                self.step(time.time())
            except Exception:  # never let the thread die: processes would skip the budget
                logger.debug("budget tick failed", exc_info=True)

    def _signals(self) -> tuple[list[float], list[bool]]:
        """Per class: the attempts and throttled answers so far; whether requests wait."""
        with self.segment.locked() as c:
            now = time.monotonic()
            out, waiting = [], []
            for i in range(len(CLASSES)):
                row = _HEAD + _ROW * i
                out += [c[row + _C_SENT], c[row + _C_THROTTLED]]
                waiting.append(c[row + _C_TAT] > now)
        return out, waiting

    def step(self, now: float) -> None:
        """One tick: exchange the counts, update each class's rate, publish."""
        totals, waiting = self._signals()
        deltas = [t - last for t, last in zip(totals, self._local, strict=True)]
        self._local = totals
        busy = [deltas[2 * i] > 0 or waiting[i] for i in range(len(CLASSES))]
        job = self._exchange(deltas, busy)
        # A rank spends its share of the job's rate: the rate over the ranks
        # not idle (a rank that is done leaves its share to the rest; a dead
        # one keeps its share: the safe side).
        share = max(1, self.world - self.idle) if job is not None else self.world
        rates = []
        for i, ctl in enumerate(self.controllers):
            if job is not None:
                sent, throttled = job[2 * i], job[2 * i + 1]
            else:  # local mode: this rank's signals stand for the job's
                sent, throttled = deltas[2 * i] * self.world, deltas[2 * i + 1]
            if sent or throttled or ctl._last is None:
                ctl.update(now, sent, throttled)
            else:
                ctl._last = now  # idle: neither grow nor cut
            leader = self.leader[i]
            if job is not None and leader is not None and self.rank != 0:
                ctl.rate = leader  # one rate for the job: rank 0's, while it publishes
            rates.append(ctl.rate)
            logger.debug(
                "budget tick %s: sent %.0f throttled %.0f -> rate %.1f (rank %d, leader %s)",
                CLASSES[i],
                sent,
                throttled,
                ctl.rate,
                self.rank,
                leader,
            )
        self._ticks += 1
        with self.segment.locked() as c:
            for i, rate in enumerate(rates):
                row = _HEAD + _ROW * i
                c[row + _C_JOB_RATE] = rate
                c[row + _C_RATE] = max(rate / share, 1e-3)
                if job is not None:
                    c[row + _C_JOB_THROTTLED] += job[2 * i + 1]
            c[_H_WORLD], c[_H_MODE], c[_H_BEAT] = share, 2 if job is not None else 1, time.time()

    def _exchange(self, deltas: list[float], busy: list[bool]) -> list[float] | None:
        """Add this rank's deltas to the job's counters; the job's deltas, or ``None``.

        A class this rank neither sent nor waits on is not exchanged (its job
        deltas read 0: its controller holds). The count of idle ranks is one
        more counter: +1 when this rank has had nothing to send for
        :data:`IDLE_TICKS` ticks, -1 when it has again. Every rank starts busy,
        so that a job's first ticks never give one rank the whole job's rate.
        """
        store = self._connect()
        if store is None:
            return None
        try:
            self._quiet = 0 if any(busy) else self._quiet + 1
            idle_now = self._quiet >= IDLE_TICKS
            change = int(idle_now) - int(self._idle)
            self.idle = int(store.add(f"{self.key}/idle", change))
            self._idle = idle_now
            out = [0.0] * len(deltas)
            for i in range(len(deltas)):
                cls = i // 2
                if not busy[cls] and not deltas[i]:
                    self._job.pop(i, None)  # on return, its first tick reads 0
                    continue
                name = f"{self.key}/{CLASSES[cls]}/{('sent', 'throttled')[i % 2]}"
                total = float(store.add(name, int(deltas[i])))
                last = self._job.get(i)
                self._job[i] = total
                out[i] = total - last if last is not None else 0.0
            for cls in range(len(CLASSES)):
                if busy[cls]:
                    self._share_rate(store, cls)
        except Exception as exc:  # a dead store or rank 0: local mode from now on
            logger.warning("request budget: the job's store failed (%s); local mode", exc)
            self._store, self._store_failed = None, True
            return None
        return out

    def _share_rate(self, store: Any, cls: int) -> None:
        """Rank 0 publishes its rate of class ``cls``; the others read it (one request).

        Ranks that read the same counters at slightly different moments
        drifted apart by 25-45% over a minute on 4 ranks (a throttle seen on
        one tick by some and the next by others cuts twice); adopting rank
        0's rate keeps them together. The rate travels as an ``add`` to a
        counter (one round trip, never a blocking ``get``) with rank 0's tick
        number in its low bits, so that a rank 0 that stopped publishing is
        noticed after :data:`LEADER_TICKS` ticks and each rank runs its own
        controller again.
        """
        key = f"{self.key}/{CLASSES[cls]}/rate"
        if self.rank == 0:
            code = round(self.controllers[cls].rate * 1000) * _TICKS + self._ticks % _TICKS
            store.add(key, code - self._published[cls])
            self._published[cls] = code
            return
        code = int(store.add(key, 0))
        milli, tick = divmod(code, _TICKS)
        if code and tick != self._seen[cls]:
            self._seen[cls], self._stale[cls] = tick, 0
            self.leader[cls] = milli / 1000
            return
        self._stale[cls] += 1
        if self._stale[cls] > LEADER_TICKS:
            self.leader[cls] = None

    def _connect(self) -> Any:
        if self._store is not None or self._store_failed:
            return self._store
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is a dependency
            return None
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            self._store_failed = True
            return None
        try:
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                host,
                int(port),
                is_master=False,
                timeout=timedelta(seconds=self.config.store_timeout),
                wait_for_workers=False,
            )
        except Exception as exc:
            logger.warning("request budget: no store at %s:%s (%s); local mode", host, port, exc)
            self._store_failed = True
            return None
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        return self._store
