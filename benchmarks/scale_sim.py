"""Simulation (issue 41 part 4): jobs of 8 to 4,096 nodes x 8 ranks x 8 workers on one bucket.

A stepped simulation (``--step`` seconds, 0.25 by default) on a simulated
clock. The bucket is the emulator's own request-rate model
(:class:`torchbucket.emulator._ratemodel.RateState`, GCS's figures: 5,000
reads/s to start, doubling after 20 minutes of load near capacity; here at
most 4x, its token bucket holding one step). Every process (DataLoader
worker) wants ``--demand`` reads per second (its consumer's pace, a window of
requests ahead). Three designs, each running the library's own controller
code (not a copy):

- ``per_process``: today's limit. Each process has an
  :class:`~torchbucket.runtime.retry.AdaptiveLimiter` (AIMD on requests in
  flight, 20 ms per request) and retries a throttled request after full-jitter
  backoff (:func:`~torchbucket.runtime.retry.backoff_delay`'s bounds,
  ``RetryConfig()``). Processes are simulated in 4 cohorts of identical
  processes (one limiter each: every process of a cohort sees the same
  throttled fraction).
- ``per_rank``: the budget without the store (its local mode): each rank's
  own :class:`~torchbucket.runtime.budget.RateController` fed its own
  processes' attempts and throttles (scaled by the world), spending
  ``rate / ranks``. 16 cohorts of ranks, each rank's throttles a Poisson
  draw, so that a rank sees a throttle as rarely as a real one would.
- ``jobwide``: the budget as shipped: one controller's rate (every rank runs
  the same controller on the same job totals; one instance stands for
  them), on ticks of ``BudgetConfig.tick(ranks)`` (the store's load kept
  under ``store_ops``), a new rate taking effect 0.25 s later (the booking
  horizon).

Figures per job size and design, over the run: ``throttled_fraction``
(attempts refused), ``capacity_fraction`` (reads admitted over what could
be: the modelled capacity, or the job's demand when lower; the median over
the last quarter of the run, the steady state), ``time_to_90_s`` (the first
second at 90% of that), ``fairness`` (slowest cohort's reads/s over the mean),
``store_ops_per_s`` (jobwide: 4 store requests per rank per tick, reads
only). Ends with
``RESULT {json}``: the figures as ``sim_<figure>_<nodes>`` for the job-wide
budget and ``sim_<figure>_<design>_<nodes>`` for the others, and the
simulation's own run time. Goals at 4,096 nodes: throttled <= 0.01,
capacity >= 0.9.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
from torchbucket.config import ConcurrencyConfig, RetryConfig
from torchbucket.emulator._ratemodel import RATE_PRESETS, RateState
from torchbucket.runtime.budget import AHEAD_S, BudgetConfig, RateController
from torchbucket.runtime.retry import AdaptiveLimiter, backoff_delay

NAME = "scale_sim"
RANKS_PER_NODE = 8
WORKERS_PER_RANK = 8
LATENCY_S = 0.020
DESIGNS = ("per_process", "per_rank", "jobwide")


class Clock:
    """The simulated clock every controller and the bucket read."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclasses.dataclass
class Run:
    """What one design did over the run, per step."""

    admitted: list[float] = dataclasses.field(default_factory=list)
    refused: list[float] = dataclasses.field(default_factory=list)
    possible: list[float] = dataclasses.field(default_factory=list)  # min(capacity, demand)
    cohorts: np.ndarray | None = None  # reads admitted per cohort


def bucket(clock: Clock, step: float) -> RateState:
    model = dataclasses.replace(RATE_PRESETS["gcs"], ceiling=4.0, burst=step)
    return RateState(model, clock)


def sim_per_process(nodes: int, args: argparse.Namespace) -> Run:
    clock, step, cohorts = Clock(), args.step, 4
    procs = nodes * RANKS_PER_NODE * WORKERS_PER_RANK
    per = procs / cohorts
    state = bucket(clock, step)
    limiters = [AdaptiveLimiter(ConcurrencyConfig(), clock=clock) for _ in range(cohorts)]
    retry = RetryConfig()
    slots = int(retry.max_backoff / step) + 2
    due = np.zeros((cohorts, slots))  # retries due per future step (a ring)
    queue = np.zeros(cohorts)  # requests wanted but not yet sent
    streak = np.zeros(cohorts, dtype=int)  # consecutive steps with throttles
    got = np.zeros(cohorts)
    run = Run()
    rng = random.Random(0)
    for i in range(int(args.seconds / step)):
        clock.t += step
        slot = i % slots
        queue += per * args.demand * step + due[:, slot]
        due[:, slot] = 0.0
        cap = np.array([lim.limit for lim in limiters]) * per * step / LATENCY_S
        attempts = np.minimum(queue, cap)
        queue -= attempts
        total = int(attempts.sum())
        ok, r429, r503 = state.admit("read", total)
        share = ok / total if total else 1.0
        admitted = attempts * share
        refused = attempts - admitted
        got += admitted
        for c, lim in enumerate(limiters):
            if refused[c] >= 0.5:
                lim.on_throttle()
                streak[c] += 1
                # Full jitter: the retries spread evenly over the attempt's bound.
                bound = backoff_delay(int(streak[c]) - 1, retry, _Max(rng))
                n = max(1, min(slots - 1, int(bound / step)))
                ring = (slot + 1 + np.arange(n)) % slots
                due[c, ring] += refused[c] / n
            else:
                streak[c] = 0
            lim.on_success(int(admitted[c] / per))
        run.admitted.append(ok)
        run.refused.append(r429 + r503)
        run.possible.append(min(state.capacity("read"), procs * args.demand) * step)
    run.cohorts = got
    return run


class _Max(random.Random):
    """A 'random' source whose uniform draw is its upper bound (the backoff's bound)."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(0)

    def uniform(self, a: float, b: float) -> float:
        return b


def sim_budget(nodes: int, args: argparse.Namespace, jobwide: bool) -> tuple[Run, float]:
    """The budget: one job-wide controller, or one per rank cohort fed its own signals."""
    clock, step = Clock(), args.step
    ranks = nodes * RANKS_PER_NODE
    procs = ranks * WORKERS_PER_RANK
    config = BudgetConfig(enabled=True)
    tick = config.tick(ranks)
    cohorts = 1 if jobwide else min(ranks, 16)
    per = ranks / cohorts  # ranks per cohort
    ctls = [RateController(config.read_rate, doubling=config.doubling) for _ in range(cohorts)]
    for ctl in ctls:
        ctl.update(0.0, 0, 0)
    state = bucket(clock, step)
    rng = np.random.default_rng(0)
    queue = np.zeros(cohorts)
    sent = np.zeros(cohorts)
    thr = np.zeros(cohorts)
    got = np.zeros(cohorts)
    rates = np.array([c.rate for c in ctls])  # the job rate each cohort's ranks believe
    pending: list[tuple[float, np.ndarray]] = []  # rates booked, effective after AHEAD_S
    next_tick = tick
    run = Run()
    for _ in range(int(args.seconds / step)):
        clock.t += step
        while pending and pending[0][0] <= clock.t:
            rates = pending.pop(0)[1]
        queue += per * WORKERS_PER_RANK * args.demand * step
        attempts = np.minimum(queue, rates / ranks * per * step)
        total = int(attempts.sum())
        ok, r429, r503 = state.admit("read", total)
        share = ok / total if total else 1.0
        admitted = attempts * share
        queue -= admitted  # the refused ones stay queued (retried within the budget)
        got += admitted
        sent += attempts
        if jobwide:
            thr += total - ok
        else:  # what one rank of each cohort sees: its own draws
            one = attempts / per
            thr += rng.poisson(np.maximum(one * (1.0 - share), 0.0)) * per
        if clock.t + 1e-9 >= next_tick:
            next_tick += tick
            for c, ctl in enumerate(ctls):
                scale = 1.0 if jobwide else ranks / per  # local mode: own signals x world
                ctl.update(clock.t, sent[c] * scale, thr[c] / per if not jobwide else thr[c])
            sent[:] = 0.0
            thr[:] = 0.0
            pending.append((clock.t + AHEAD_S, np.array([c.rate for c in ctls])))
        run.admitted.append(ok)
        run.refused.append(r429 + r503)
        run.possible.append(min(state.capacity("read"), procs * args.demand) * step)
    run.cohorts = got
    return run, tick


def figures(run: Run, step: float) -> dict[str, float]:
    admitted = np.array(run.admitted)
    refused = np.array(run.refused)
    possible = np.array(run.possible)
    per_s = max(1, round(1.0 / step))
    n = len(admitted) // per_s * per_s
    a = admitted[:n].reshape(-1, per_s).sum(axis=1)
    p = possible[:n].reshape(-1, per_s).sum(axis=1)
    frac = a / np.maximum(p, 1e-9)
    reach = np.nonzero(frac >= 0.9)[0]
    tail = frac[len(frac) * 3 // 4 :]
    assert run.cohorts is not None
    cohorts = run.cohorts
    return {
        "throttled_fraction": float(refused.sum() / max(1.0, admitted.sum() + refused.sum())),
        "capacity_fraction": float(np.median(tail)),
        "time_to_90_s": float(reach[0] + 1) if len(reach) else math.nan,
        "fairness": float(cohorts.min() / cohorts.mean()) if cohorts.mean() else math.nan,
        "capacity_final": float(p[-1]),
    }


def plot(rows: list[dict[str, Any]]) -> Path:
    """Throttled and capacity fractions by job size, one line per design."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for design in DESIGNS:
        mine = [r for r in rows if r["design"] == design]
        nodes = [r["nodes"] for r in mine]
        ax.plot(nodes, [max(r["throttled_fraction"], 1e-5) for r in mine], "o-", label=design)
        ax2.plot(nodes, [r["capacity_fraction"] for r in mine], "o-", label=design)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(0.01, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("nodes (x 8 ranks x 8 workers)")
    ax.set_ylabel("fraction of requests throttled")
    ax2.set_xscale("log", base=2)
    ax2.axhline(0.9, color="grey", ls=":", lw=0.8)
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("nodes (x 8 ranks x 8 workers)")
    ax2.set_ylabel("reads admitted / capacity (steady)")
    ax.legend(fontsize=8)
    fig.suptitle("Simulation: GCS's request-rate model, one bucket")
    fig.tight_layout()
    path = h.OUTPUT_DIR / f"{NAME}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the four sizes, 4 simulated hours")
    mode.add_argument("--smoke", action="store_true", help="8 and 64 nodes, 10 simulated minutes")
    p.add_argument("--nodes", default=None, help="job sizes, comma-separated (8,64,512,4096)")
    p.add_argument("--seconds", type=float, default=None, help="simulated seconds (14,400)")
    p.add_argument("--step", type=float, default=0.25, help="seconds per step (0.25)")
    p.add_argument("--demand", type=float, default=50.0, help="reads/s each worker wants (50)")
    args = p.parse_args(argv)
    if args.nodes is None:
        args.nodes = "8,64" if args.smoke else "8,64,512,4096"
    if args.seconds is None:
        args.seconds = 600.0 if args.smoke else 14400.0
    args.nodes = [int(n) for n in str(args.nodes).split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.process_time()
    payload: dict[str, Any] = {}
    rows = []
    for nodes in args.nodes:
        runs: dict[str, Callable[[int], tuple[Run, float]]] = {
            "per_process": lambda n: (sim_per_process(n, args), math.nan),
            "per_rank": lambda n: sim_budget(n, args, jobwide=False),
            "jobwide": lambda n: sim_budget(n, args, jobwide=True),
        }
        for design, go in runs.items():
            t0 = time.process_time()
            run, tick = go(nodes)
            fig = figures(run, args.step)
            ranks = nodes * RANKS_PER_NODE
            if design == "jobwide":
                fig["tick_s"] = tick
                fig["store_ops_per_s"] = 4 * ranks / tick
            rows.append(
                {"nodes": nodes, "design": design, **fig, "cpu_s": time.process_time() - t0}
            )
            suffix = f"_{nodes}" if design == "jobwide" else f"_{design}_{nodes}"
            for k, v in fig.items():
                payload[f"sim_{k}{suffix}"] = round(v, 4)
            print(f"{nodes} nodes, {design}: " + ", ".join(f"{k} {v:.4g}" for k, v in fig.items()))
    h.print_table(
        "Simulation: one bucket, GCS's rate model, 8 ranks x 8 workers per node",
        rows,
        [
            ("nodes", "nodes", "d"),
            ("design", "design", "s"),
            ("throttled_fraction", "throttled", ".4f"),
            ("capacity_fraction", "capacity", ".3f"),
            ("time_to_90_s", "to 90% s", ".0f"),
            ("fairness", "fairness", ".3f"),
            ("cpu_s", "sim CPU s", ".1f"),
        ],
    )
    payload["sim_cpu_s"] = round(time.process_time() - started, 2)
    payload["sim_seconds"] = args.seconds
    png = plot(rows)
    payload["figure"] = h.rel(png)
    h.write_json(NAME, {"result": payload, "args": vars(args), "rows": rows})
    h.emit_result(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
