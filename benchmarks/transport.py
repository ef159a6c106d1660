"""Transport benchmark (issue 2): client CPU per object reading small objects.

Fetches ``--count`` objects of ``--size`` bytes (default 3,000 x 10 KiB) from
the emulator's model store, ``--concurrency`` in flight (default 64), through

- ``torchbucket``: ``GCSStore.get`` on torchbucket's background loop (retries,
  adaptive limiter, CRC32C check, error mapping included);
- ``gcs_client``: ``google-cloud-storage``'s ``blob.download_as_bytes`` on a
  thread pool of the same size (run with ``.venv-bench``'s interpreter);
- ``aiohttp``: a bare ``aiohttp`` loop, the limit (no retries, no checksum).

Each contender runs in its own process. It first fetches ``--concurrency``
objects untimed through the same client (imports, event loop or thread pool,
session and connections are then up, as in a long-running job), then all of
them in the measured phase: its CPU (user + system of the process) over that
phase, divided by the objects, is the figure. Every byte is checked after the
phase against the generated contents. Contenders take turns, repeat after
repeat, and the tables show medians.

The CPU measure runs WITHOUT modelled latency: per-object CPU is what the
benchmark is about, and without latency the server answers at once, so the
phase is short and CPU-bound and nothing else (sleeping, timers) dilutes it.
Unless ``--smoke``, a second round runs behind the ``same-region`` latency
model to show objects/s when latency, not CPU, bounds the rate (and CPU per
object there, which is a little higher: fewer responses per loop wake-up).

``--quick`` (5 repeats, 2 behind latency) ends with ``RESULT {json}`` holding
``cpu_us_per_obj_torchbucket``, ``cpu_us_per_obj_gcs_client`` and
``cpu_us_per_obj_aiohttp``, the ratios and whether the goals hold: torchbucket
within 1.3x of bare aiohttp and at least 4x below google-cloud-storage.

Request accounting (:mod:`torchbucket.accounting`, always on) is measured by a
fourth contender, ``torchbucket_no_accounting``: the same script with the
counting functions replaced by no-ops in its process, taking its turn between
the others; ``accounting_cpu_overhead_pct`` in ``RESULT`` is the difference of
the medians (within the run-to-run noise: counting is a few integer additions
per request).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

NAME = "transport"
BUCKET = "transport"
PREFIX = "t/"
CONTENDERS = [
    ("torchbucket", "torchbucket_get.py", False),
    ("torchbucket_no_accounting", "torchbucket_get.py", False),
    ("gcs_client", "gcs_client_load.py", True),
    ("aiohttp", "aiohttp_loop.py", False),
]
LABELS = {
    "torchbucket": "torchbucket GCSStore",
    "torchbucket_no_accounting": "  same, request counting patched out",
    "gcs_client": "google-cloud-storage (threads)",
    "aiohttp": "bare aiohttp loop",
}
GOAL_VS_AIOHTTP = 1.3
# The contender's spec beyond the common one: request accounting replaced by
# no-ops inside that process only (the library has no switch: it needs none).
SPEC_EXTRA: dict[str, dict[str, Any]] = {"torchbucket_no_accounting": {"accounting": False}}
GOAL_VS_GCS_CLIENT = 4.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 repeats instead of 9")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat, no latency round")
    p.add_argument("--count", type=int, default=None, help="objects (default 3,000)")
    p.add_argument("--size", type=int, default=10 * 1024, help="bytes per object (10 KiB)")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (64)")
    p.add_argument("--repeats", type=int, default=None, help="repeats (9; --quick 5)")
    p.add_argument("--no-latency-round", action="store_true", help="skip the round behind latency")
    args = p.parse_args(argv)
    if args.count is None:
        args.count = 200 if args.smoke else 3000
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 5 if args.quick else 9
    return args


def run_round(
    emu: Any, args: argparse.Namespace, *, repeats: int, bench_py: str | None
) -> dict[str, list[h.ContenderRun]]:
    """Each contender ``repeats`` times, taking turns."""
    spec = {
        "endpoint": emu.endpoint,
        "bucket": BUCKET,
        "prefix": PREFIX,
        "count": args.count,
        "size": args.size,
        "seed": 0,
        "concurrency": args.concurrency,
        "verify": "after",
        "warmup": args.concurrency,
    }
    env = {"STORAGE_EMULATOR_HOST": emu.endpoint}
    # One untimed pass warms the server (its connections, its allocator).
    h.run_contender("transport-warmup", "aiohttp_loop.py", spec, env=env)
    runs: dict[str, list[h.ContenderRun]] = {name: [] for name, _, _ in CONTENDERS}
    for i in range(repeats):
        for name, script, needs_bench in CONTENDERS:
            if needs_bench and bench_py is None:
                continue
            run = h.run_contender(
                f"transport-{name}-{i}",
                script,
                {**spec, **SPEC_EXTRA.get(name, {})},
                python=bench_py if needs_bench else None,
                env=env,
            )
            runs[name].append(run)
    return runs


def summarize(runs: dict[str, list[h.ContenderRun]], count: int) -> dict[str, dict[str, float]]:
    """Median figures per contender."""
    out: dict[str, dict[str, float]] = {}
    for name, rs in runs.items():
        if not rs:
            out[name] = {}
            continue
        per = [
            {
                "cpu_us_per_obj": r.data["cpu_s"] / r.data["objects"] * 1e6,
                "objects_per_s": r.data["objects"] / r.data["wall_s"],
                "wall_s": r.data["wall_s"],
                "server_cpu_us_per_obj": r.data["server"]["cpu_s"] / r.data["objects"] * 1e6,
                "requests_b": r.data["server"]["class_b"],
                "process_cpu_s": r.process_cpu_s,
                "peak_rss_mb": r.peak_rss_main_mb,
            }
            for r in rs
        ]
        out[name] = {k: h.median([p[k] for p in per]) for k in per[0]}
        out[name]["repeats"] = len(rs)
        assert all(r.data["objects"] == count for r in rs)
    return out


def table(title: str, summary: dict[str, dict[str, float]]) -> None:
    base = summary["aiohttp"].get("cpu_us_per_obj", math.nan)
    rows = [
        {
            "contender": LABELS[name],
            **s,
            "vs_aiohttp": h.ratio(s.get("cpu_us_per_obj", math.nan), base),
        }
        for name, s in summary.items()
    ]
    h.print_table(
        title,
        rows,
        [
            ("contender", "contender", "s"),
            ("cpu_us_per_obj", "client CPU us/obj", ".0f"),
            ("vs_aiohttp", "x bare loop", ".2f"),
            ("objects_per_s", "objects/s", ",.0f"),
            ("server_cpu_us_per_obj", "server CPU us/obj", ".0f"),
            ("peak_rss_mb", "peak RSS MiB", ".0f"),
            ("repeats", "runs", "d"),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench_py = h.bench_python()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    print(
        f"transport: {args.count} objects x {args.size} B, {args.concurrency} in flight, "
        f"{args.repeats} repeat(s), mode {mode}; every byte checked"
    )
    if bench_py is None:
        print("  google-cloud-storage contender skipped: run benchmarks/setup_bench_env.sh")
    with h.emulator(latency=None) as emu:
        h.seed(emu, BUCKET, count=args.count, size=args.size, prefix=PREFIX)
        runs = run_round(emu, args, repeats=args.repeats, bench_py=bench_py)
        summary = summarize(runs, args.count)
        latency_summary: dict[str, dict[str, float]] | None = None
        if not args.smoke and not args.no_latency_round:
            emu.set_latency("same-region")
            lat_runs = run_round(emu, args, repeats=max(1, args.repeats // 2), bench_py=bench_py)
            latency_summary = summarize(lat_runs, args.count)

    table("Without latency (the CPU measure), medians:", summary)
    if latency_summary is not None:
        table("Behind the same-region latency model (20 ms per GET), medians:", latency_summary)

    cpu = {name: s.get("cpu_us_per_obj", math.nan) for name, s in summary.items()}
    vs_aiohttp = h.ratio(cpu["torchbucket"], cpu["aiohttp"])
    gcs_vs_tb = h.ratio(cpu["gcs_client"], cpu["torchbucket"])
    accounting_pct = (h.ratio(cpu["torchbucket"], cpu["torchbucket_no_accounting"]) - 1) * 100
    result: dict[str, Any] = {
        "cpu_us_per_obj_torchbucket": round(cpu["torchbucket"], 1),
        "cpu_us_per_obj_gcs_client": round(cpu["gcs_client"], 1),
        "cpu_us_per_obj_aiohttp": round(cpu["aiohttp"], 1),
        "cpu_us_per_obj_torchbucket_no_accounting": round(cpu["torchbucket_no_accounting"], 1),
        "accounting_cpu_overhead_pct": round(accounting_pct, 1),
        "ratio_torchbucket_vs_aiohttp": round(vs_aiohttp, 3),
        "ratio_gcs_client_vs_torchbucket": round(gcs_vs_tb, 2),
        "objects_per_s_torchbucket": round(summary["torchbucket"]["objects_per_s"]),
        "objects_per_s_gcs_client": round(summary["gcs_client"].get("objects_per_s", math.nan))
        if summary["gcs_client"]
        else None,
        "objects_per_s_aiohttp": round(summary["aiohttp"]["objects_per_s"]),
        "goal_within_1_3x_aiohttp": bool(vs_aiohttp <= GOAL_VS_AIOHTTP),
        "goal_4x_below_gcs_client": bool(gcs_vs_tb >= GOAL_VS_GCS_CLIENT),
        "objects": args.count,
        "object_size": args.size,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "latency": "none",
        "bytes_verified": True,
        "mode": mode,
    }
    if latency_summary is not None:
        for name, s in latency_summary.items():
            if s:
                result[f"latency_objects_per_s_{name}"] = round(s["objects_per_s"])
    print(
        f"\ntorchbucket uses {vs_aiohttp:.2f}x the bare loop's CPU per object "
        f"(goal <= {GOAL_VS_AIOHTTP}); google-cloud-storage uses {gcs_vs_tb:.1f}x "
        f"torchbucket's (goal >= {GOAL_VS_GCS_CLIENT}). Request accounting: "
        f"{accounting_pct:+.1f}% CPU per object against the same store with it patched out."
    )
    order = [name for name, _, _ in CONTENDERS]
    labels = [LABELS[n] for n in order]
    panels = [
        h.Panel(
            "Client CPU per object (no latency)",
            labels,
            [cpu[n] for n in order],
            "microseconds",
        ),
        h.Panel(
            "Objects/s (no latency)",
            labels,
            [summary[n].get("objects_per_s") for n in order],
            "objects/s",
        ),
    ]
    if latency_summary is not None:
        panels.append(
            h.Panel(
                "Objects/s (same-region latency)",
                labels,
                [latency_summary[n].get("objects_per_s") for n in order],
                "objects/s",
            )
        )
    png = h.bar_chart(
        NAME,
        panels,
        suptitle=f"{args.count} x {args.size // 1024} KiB, {args.concurrency} in flight",
    )
    path = h.write_json(
        NAME,
        {
            "result": result,
            "summary": summary,
            "latency_summary": latency_summary,
            "figure": h.rel(png),
            "runs": {n: [r.flat() for r in rs] for n, rs in runs.items()},
            "notes": [
                "CPU is user+system of the contender's process over the fetch phase only.",
                "The CPU measure runs without modelled latency; see the module docstring.",
                "google-cloud-storage runs with its HTTP pool widened to the concurrency.",
            ],
        },
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
