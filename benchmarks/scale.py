"""Scale benchmark (issue 41): one job of ranks x DataLoader workers against GCS's rate model.

On the emulator's model store (``same-region`` latency) with its request-rate
model (:mod:`torchbucket.emulator._ratemodel`; here 100 reads/s to start,
doubling after 8 s of load near capacity, at most 2x: GCS's shape scaled to
this machine), each contender runs as a job of ``--ranks`` processes on gloo
(``torch.distributed.run``), each with ``--workers`` DataLoader workers,
reading its shard of small objects once (``_contenders/scale_rank.py``; one
GET per sample, compose off). The bucket is made cold (initial capacity)
when every rank is ready. Contenders, side by side in one run:

- ``per_process``: torchbucket with today's limit, AIMD per process
  (``TORCHBUCKET_BUDGET=0``);
- ``jobwide``: torchbucket with the job-wide budget
  (``TORCHBUCKET_BUDGET={"read_rate": 100, "doubling": 8}``: GCS's starting
  rate and ramp, scaled as the model is);
- ``dataflux``: gcs-torch-dataflux 1.4.0 map-style, 8 threads per worker
  (``.venv-bench``);
- ``gcsfs``: a map-style dataset whose batch is one gcsfs ``cat``
  (``.venv-gcsfs``).

Figures per contender, from the server's per-second windows: the fraction of
requests answered 429/503 (``throttled_fraction``); reads admitted per second
over the modelled capacity (``capacity_fraction``, the steady state: windows
after the capacity reached its ceiling, until the first rank finished;
plotted over time in ``bench-output/scale.png``, copied to ``docs/img/``); seconds from the
cold start to the first window at 90% of capacity (``time_to_90_s``); the
epoch time (the last rank's end); fairness (slowest rank's samples/s over the
mean); and the emulator's CPU. ``speedup_vs_per_process`` is the per-process
epoch time over the job-wide one.

Ends with ``RESULT {json}``. Goals: ``throttled_fraction_jobwide`` <= 0.01,
``capacity_fraction_jobwide`` >= 0.9, ``fairness_jobwide`` >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

NAME = "scale"
BUCKET = "scale"
PREFIX = "s/"
RATE_MODEL = {"read_rate": 100.0, "write_rate": 20.0, "double_after": 8.0, "ceiling": 2.0}
BUDGET = {"read_rate": 100.0, "write_rate": 20.0, "doubling": 8.0}
CONTENDERS = ("per_process", "jobwide", "dataflux", "gcsfs")
#: Seconds after the capacity's last doubling that steady state begins.
SETTLE_S = 15.0
RANK_SCRIPT = h.CONTENDERS_DIR / "scale_rank.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="10,000 objects (a few minutes)")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes (a code-path check)")
    p.add_argument("--objects", type=int, default=None, help="objects in the dataset (20,000)")
    p.add_argument("--size", type=int, default=1024, help="bytes per object (1 KiB)")
    p.add_argument("--ranks", type=int, default=4, help="ranks (gloo), default 4")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--only", default=",".join(CONTENDERS), help="contenders, comma-separated")
    p.add_argument("--timeout", type=float, default=None, help="seconds per contender")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    if args.objects is None:
        args.objects = 600 if args.smoke else 10000 if args.quick else 20000
    if args.smoke:
        args.ranks, args.workers = min(args.ranks, 2), min(args.workers, 2)
    if args.timeout is None:
        args.timeout = 120.0 if args.smoke else 400.0
    return args


def python_of(name: str) -> str | None:
    if name in ("per_process", "jobwide"):
        return sys.executable
    return h.bench_python() if name == "dataflux" else h.fsspec_python()


def run_job(name: str, emu: Any, args: argparse.Namespace) -> dict[str, Any] | None:
    """One contender's job; its ranks' results and the model's timeline, or ``None``."""
    python = python_of(name)
    if python is None:
        print(f"{name}: skipped (no environment; run benchmarks/setup_bench_env.sh)")
        return None
    out = Path(tempfile.mkdtemp(prefix=f"scale-{name}-"))
    spec = {
        "endpoint": emu.endpoint,
        "bucket": BUCKET,
        "prefix": PREFIX,
        "count": args.objects,
        "size": args.size,
        "seed": 0,
        "kind": {"per_process": "tb", "jobwide": "tb"}.get(name, name),
        "batch_size": args.batch_size,
        "num_workers": args.workers,
        "rate_model": RATE_MODEL,
        "out": str(out),
    }
    env = {**os.environ, "PYTHONPATH": str(h.CONTENDERS_DIR)}
    env["TORCHBUCKET_BUDGET"] = json.dumps(BUDGET) if name == "jobwide" else "0"
    cmd = [python, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc_per_node", str(args.ranks), str(RANK_SCRIPT), json.dumps(spec)]
    started = time.monotonic()
    h.LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = h.LOG_DIR / f"scale-{name}.log"
    with open(log, "w") as f:
        proc = subprocess.run(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout
        )
    if proc.returncode != 0:
        raise h.ContenderError(f"{name} failed ({proc.returncode}); see {h.rel(log)}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    return {
        "ranks": ranks,
        "model": emu.rate_model_stats(),
        "server": emu.stats(),
        "wall_s": time.monotonic() - started,
    }


def figures(job: dict[str, Any]) -> dict[str, Any]:
    """The contender's figures from its ranks and the model's per-second windows."""
    ranks = job["ranks"]
    line = job["model"]["read"]["timeline"]
    initial = RATE_MODEL["read_rate"]
    top = initial * RATE_MODEL["ceiling"]
    epoch = max(r["t_end"] for r in ranks)
    first_done = min(r["t_end"] for r in ranks)
    admitted = sum(w[1] for w in line)
    refused = sum(w[2] + w[3] for w in line)
    caps = [initial] + [w[4] for w in line[:-1]]  # the capacity in force during each window
    series = [(w[0], w[1] / cap, cap, w[2] + w[3]) for w, cap in zip(line, caps, strict=True)]
    # The model's clock starts at the reset, the ranks' a barrier later: close enough.
    # Steady: from SETTLE_S after the capacity reached its ceiling to the first rank's end.
    topped = next((t for t, _, cap, _ in series if cap >= top), None)
    steady = [
        f for t, f, *_ in series if topped is not None and topped + SETTLE_S <= t <= first_done
    ]
    reach = [t for t, f, *_ in series if f >= 0.9]
    rates = [r["samples"] / r["t_end"] for r in ranks if r["t_end"] > 0]
    mean = sum(rates) / len(rates)
    return {
        "throttled_fraction": refused / max(1, admitted + refused),
        "capacity_fraction": h.median(steady) if steady else float("nan"),
        "capacity_fraction_mean": (sum(steady) / len(steady)) if steady else float("nan"),
        "time_to_90_s": reach[0] if reach else float("nan"),
        "epoch_s": epoch,
        "fairness": min(rates) / mean,
        "samples": sum(r["samples"] for r in ranks),
        "emulator_cpu_s": job["server"].get("cpu_seconds", float("nan")),
        "series": series,
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for name, fig_ in results.items():
        t = [s[0] for s in fig_["series"]]
        ax.plot(t, [s[1] for s in fig_["series"]], label=name)
        ax2.plot(t, [s[1] * s[2] for s in fig_["series"]], label=name)
    any_ = next(iter(results.values()))
    ax2.plot([s[0] for s in any_["series"]], [s[2] for s in any_["series"]], "k--", lw=1)
    ax.axhline(0.9, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("reads admitted / capacity")
    ax.set_ylim(0, 1.3)
    ax2.set_ylabel(f"reads admitted per s (--: capacity, {next(iter(results))} run)")
    ax2.set_xlabel("seconds from a cold bucket")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("One job against GCS's request-rate model (scaled): per-second windows")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    results: dict[str, dict[str, Any]] = {}
    with h.emulator("same-region") as emu:
        h.seed(emu, BUCKET, count=args.objects, size=args.size, prefix=PREFIX)
        for name in names:
            job = run_job(name, emu, args)
            if job is not None:
                results[name] = figures(job)
                print(
                    f"{name}: "
                    + ", ".join(
                        f"{k} {v:.3g}" for k, v in results[name].items() if isinstance(v, float)
                    ),
                    flush=True,
                )
    keys = ("throttled_fraction", "capacity_fraction", "time_to_90_s", "epoch_s", "fairness")
    keys += ("emulator_cpu_s",)
    rows = [{"contender": name, **fig} for name, fig in results.items()]
    h.print_table(
        "Scale: one job against the request-rate model",
        rows,
        [("contender", "contender", "s"), *((k, k, ".3g") for k in keys)],
    )
    payload: dict[str, Any] = {
        f"{k}_{name}": round(fig[k], 4) for name, fig in results.items() for k in keys
    }
    if "per_process" in results and "jobwide" in results:
        payload["speedup_vs_per_process"] = round(
            results["per_process"]["epoch_s"] / results["jobwide"]["epoch_s"], 3
        )
    payload.update(ranks=args.ranks, workers=args.workers, objects=args.objects)
    if not args.no_plot and results:
        png = h.OUTPUT_DIR / f"{NAME}.png"
        plot(results, png)
        payload["figure"] = h.rel(png)
    h.write_json(
        NAME,
        {
            "result": payload,
            "args": vars(args),
            "rate_model": RATE_MODEL,
            "budget": BUDGET,
            "results": results,
            "notes": [
                "series: per one-second window of the rate model, [end s, reads admitted / "
                "capacity in force, capacity, refused (429 + 503)].",
                f"capacity_fraction: median over the windows from {SETTLE_S:g} s after the "
                "capacity reached its ceiling to the first rank's end.",
            ],
        },
    )
    h.emit_result(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
