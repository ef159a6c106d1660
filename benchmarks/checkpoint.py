"""Checkpoint benchmark (issue 5): save and load a state dict, side by side.

Against the emulator's model store behind the ``same-region`` latency model
(40 ms per write or multipart call, 20 ms to the first byte of a GET, 200 MB/s
per body each way), one run holds every contender against the same server:

- ``torch.save`` / ``torch.load`` of one state dict (about 1 GiB; ``--quick``
  512 MiB) of a few large fp32 tensors (70%), 16 bf16 ones (20%) and about
  1,500 small ones per GiB (10%), through
  - torchbucket: ``BucketCheckpoint().save(obj, uri)`` / ``.load(uri)``;
  - the floor (issue 45, ``_contenders/ckpt_floor.py``): the same bytes
    through this client's own upload session and ranged download, out of and
    into a preallocated buffer, no torch: as fast as this client moves them;
  - gcs-torch-dataflux 1.4.0: ``DatafluxCheckpoint.writer`` / ``.reader``
    (in ``.venv-bench``: it needs ``google-cloud-storage<3``);
  - the same dataflux code (``ckpt_dataflux``'s save and load) on
    ``torchbucket.dataflux``, the compatibility layer, in ``.venv``:
    reported beside the native API as ``compat_*_vs_native``;
  - plain google-cloud-storage: ``torch.save`` into a ``BytesIO``,
    ``blob.upload_from_file``; ``blob.download_as_bytes``, ``torch.load``;
- ``torch.distributed.checkpoint`` on 2 ranks (gloo on CPU, spawned), the
  large tensors as DTensors sharded over the ranks and the small ones
  replicated: torchbucket's ``BucketStorageWriter`` / ``BucketStorageReader``
  against dataflux's ``GCSDistributedWriter`` / ``GCSDistributedReader`` (with a
  small shim: under torch 2.13 dataflux 1.4.0 closes its stream twice, see
  ``_contenders/dcp_dataflux.py``) and against torch's own ``FsspecWriter`` /
  ``FsspecReader`` on gcsfs;
- gcsfs (fsspec): ``torch.save`` / ``torch.load`` through ``fs.open``; gcsfs
  and torch's fsspec DCP run in ``.venv-gcsfs`` (gcsfs 2026.x needs
  google-cloud-storage>=3), with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``
  (else gcsfs first asks a gRPC API, which an HTTP-only endpoint never answers,
  what kind of bucket it is).

Each save and each load runs in its own process (``_contenders/ckpt_*.py``,
``dcp_*.py``); its client was opened with one request before the measured
phase (a training job saving every N steps has a warm client). Every load is
checked against the original: the SHA-1 of every tensor (every rank's shard
for DCP) must equal the digest of the tensor that was saved. A 5 ms sampling
thread in each process records the RSS just before the operation (the state
dict already in memory; for a load, the empty process or, for DCP, the
zero-filled state dict to load into) and its peak during it. Times are medians
over the repeats, the order of contenders rotating between repeats; extra RSS
is the largest over the repeats.

Ends with ``RESULT {json}``: ``{save,load}_speedup_vs_dataflux``,
``dcp_{save,load}_speedup_vs_dataflux`` (dataflux's median time over
torchbucket's; goals 1.5x, 3x, 1.5x, 1.5x) and ``{save,load}_peak_extra_rss_fraction``
(torchbucket's peak RSS during the operation minus the RSS before it, over
the checkpoint; goals 0.25 and 1.05, the loaded tensors being 1.0); beside
them the same against gcsfs and torch's fsspec DCP (goals 1.5x) and
``dcp_load_peak_extra_rss_fraction`` (over a rank's part; goal 0.5).

Floor and CPU (issue 45): every row has MB/s, client CPU seconds per GiB and
``fraction_of_floor`` (the floor's time over the contender's); RESULT has
``{save,load}_fraction_of_floor`` (goal >= 0.8), ``{op}_cpu_s_per_gib``,
``floor_{op}_cpu_s_per_gib``, ``{op}_cpu_vs_floor`` (load goal <= 1.5) and the
DCP contenders' CPU per GiB. ``--large-mib`` (4096 with ``--quick``, 8192 in
full mode) then runs torchbucket, the floor and dataflux on that size under
the first preset; its keys end ``_{N}mib``.

Zonal (Rapid) buckets (issue 42, ``_ckpt_zonal.py``): torchbucket against
gcsfs over the emulator's gRPC endpoint, ``--zonal-mib``; RESULT adds
``speedup_vs_gcsfs_zonal_{save,load}`` (goal 1.5) and ``client_cpu_ms_per_mib_zonal_{save,load}``.

Latency (issue 19): ``--latency`` takes presets alternated repeat by
repeat (``_harness.alternating_runs``), by default ``same-region``
(constant) and ``same-region-tail`` (a log-normal tail with
p99 = 5x the median and 1 request in 1,000 stalled 2 s). The first preset's
figures are the keys above; RESULT adds ``tail_slowdown_{save,load}_{key}``
(time under the tail over time under the constant preset, for torchbucket,
dataflux and both DCP contenders) and ``*_speedup_vs_dataflux_tail``. Only
those four contenders run under the presets after the first: no figure of
the others under the tail is reported (the floor, the compatibility layer,
google-cloud-storage, gcsfs and torch's fsspec DCP, whose one DCP load took
208 s, ran there for nothing before).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _ckpt_report as report
import _ckpt_zonal as zonal
import _harness as h
from _ckpt_large import run_large

NAME = "checkpoint"
BUCKET = "bench-ckpt"
MiB = 1 << 20
GOALS, GOALS_FSSPEC = report.GOALS, report.GOALS_FSSPEC
GOAL_LOAD_RSS, GOAL_DCP_LOAD_RSS = report.GOAL_LOAD_RSS, report.GOAL_DCP_LOAD_RSS
# What the gcsfs contenders need on an HTTP-only endpoint (said in the output).
FSSPEC_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    script: str
    bench_env: bool
    dcp: bool
    fsspec: bool = False  # runs in .venv-gcsfs (h.fsspec_python())


CONTENDERS = [
    Contender("torchbucket", "torchbucket", "ckpt_torchbucket.py", False, False),
    Contender(
        "floor", "floor (upload session / ranged download, no torch)", "ckpt_floor.py", False, False
    ),
    Contender("dataflux", "dataflux", "ckpt_dataflux.py", True, False),
    Contender(
        "dataflux_compat",
        "dataflux code on torchbucket.dataflux",
        "ckpt_dataflux_compat.py",
        False,
        False,
    ),
    Contender("gcs", "google-cloud-storage", "ckpt_gcs.py", True, False),
    Contender("dcp_torchbucket", "torchbucket DCP", "dcp_torchbucket.py", False, True),
    Contender("dcp_dataflux", "dataflux DCP", "dcp_dataflux.py", True, True),
    Contender("gcsfs", "gcsfs (fs.open)", "ckpt_gcsfs.py", False, False, fsspec=True),
    Contender(
        "dcp_fsspec", "torch FsspecWriter/Reader (gcsfs)", "dcp_fsspec.py", False, True, fsspec=True
    ),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="512 MiB state dict")
    mode.add_argument("--smoke", action="store_true", help="32 MiB (a code-path check)")
    p.add_argument("--size-mib", type=int, default=None, help="state dict size (1024)")
    p.add_argument("--repeats", type=int, default=3, help="saves and loads per contender (3)")
    p.add_argument(
        "--large-mib",
        type=int,
        default=None,
        help="a second, large state dict for torchbucket, the floor and dataflux, under the first "
        "latency preset (default 4096 with --quick, 8192 in full mode, 0 (none) with --smoke)",
    )
    p.add_argument(
        "--floor-touched",
        action="store_true",
        help="the floor loads into pages touched beforehand (default: fresh pages, as a load's)",
    )
    p.add_argument(
        "--large-repeats",
        type=int,
        default=None,
        help="repeats of the large size (2 with --quick, else --repeats)",
    )
    p.add_argument("--ranks", type=int, default=2, help="DCP world size (2)")
    p.add_argument(
        "--fsspec-repeats",
        type=int,
        default=1,
        help="saves and loads of gcsfs and torch's fsspec DCP (1: at 512 MiB one DCP load "
        "through gcsfs took 208 s; far from the others, their time varies little)",
    )
    p.add_argument("--only", default=None, help="comma-separated contender keys (default all)")
    zonal.add_argument(p)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per contender run")
    p.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help="bytes/s per body in the latency model (default the preset's 200e6)",
    )
    p.add_argument(
        "--tb-config",
        type=json.loads,
        default=None,
        help="torchbucket CheckpointConfig fields as JSON, e.g. '{\"parts_in_flight\": 16}'",
    )
    p.add_argument(
        "--latency",
        default="same-region,same-region-tail",
        help="comma-separated emulator latency presets, alternated repeat by repeat (default "
        "both: the constant same-region and same-region-tail, its medians with a tail and stalls); the "
        "first one's figures are the main RESULT keys",
    )
    args = p.parse_args(argv)
    args.presets = [x for x in args.latency.split(",") if x]
    if args.size_mib is None:
        args.size_mib = 32 if args.smoke else 512 if args.quick else 1024
    if args.smoke:
        args.repeats = 1
    if args.large_mib is None:
        args.large_mib = 0 if args.smoke else 4096 if args.quick else 8192
    if args.large_repeats is None:
        # Two in --quick: a 4 GiB run of the three takes about 7 minutes here.
        args.large_repeats = min(args.repeats, 2) if args.quick else args.repeats
    return args


# ----------------------------------------------------------------- one run


def run_one(
    emu: Any,
    c: Contender,
    op: str,
    rep: int,
    args: argparse.Namespace,
    bench_py: str | None,
    size_mib: int,
    *,
    prefix: str | None = None,
) -> dict[str, Any]:
    """One save or load by one contender; its figures (digests kept for checking).

    ``prefix``: the object's prefix, if not the contender's own key.
    """
    name = f"{prefix or c.key}/rep{rep}" + ("" if c.dcp else ".pt")
    spec = {
        "op": op,
        "endpoint": emu.endpoint,
        "bucket": BUCKET,
        "name": name,
        "size": size_mib * MiB,
        "seed": 0,
        "ranks": args.ranks,
        # The originals' digests, once per size (the floor has no tensors).
        "digest": op == "save" and rep == 0,
    }
    if c.key == "floor" and args.floor_touched:
        spec["floor_touched"] = True
    if args.tb_config and (c.key.endswith("torchbucket") or c.key == "floor"):
        spec["tb_config"] = args.tb_config
    env = {"STORAGE_EMULATOR_HOST": emu.endpoint}
    if c.fsspec:
        env.update(FSSPEC_ENV)
    run = h.run_contender(
        f"ckpt-{c.key}-{op}-{rep}",
        c.script,
        spec,
        python=h.fsspec_python() if c.fsspec else bench_py if c.bench_env else None,
        env=env,
        timeout=args.timeout,
    )
    d = run.data
    server = d.get("server") or {}
    return {
        "wall_s": d["wall_s"],
        "client_cpu_s": d["cpu_s"],
        "server_cpu_s": server.get("cpu_s", math.nan),
        "requests": server.get("requests", 0),
        "by_op": server.get("by_op", {}),
        "failures": {k: v for k, v in server.get("by_status", {}).items() if k[:1] != "2"},
        "rss_baseline_mib": d["rss_baseline"] / MiB,
        "rss_peak_mib": d["rss_peak"] / MiB,
        "rss_extra_mib": d["rss_extra"] / MiB,
        "nbytes": d.get("nbytes") or sum(d.get("local_nbytes", [])),
        # What the process holds: the state dict, or for DCP the largest rank's part.
        "held_bytes": d.get("nbytes") or max(d.get("local_nbytes", [0])),
        "digests": d.get("digests"),
        "per_rank": d.get("per_rank"),
    }


def run_size(
    emu: Any,
    args: argparse.Namespace,
    bench_py: str | None,
    size_mib: int,
    selected: list[Contender],
    presets: list[str],
    model: Any,
) -> dict[str, dict[str, dict[str, list[dict[str, Any]]]]]:
    """Every save and load of one state dict size: runs by preset, contender and operation."""
    runs_by: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        preset: {c.key: {"save": [], "load": []} for c in selected} for preset in presets
    }
    # The originals' digests: single-file and DCP (per rank), from the first saves.
    expected: dict[bool, Any] = {}
    for rep, preset, c in h.alternating_runs(
        emu, presets, args.repeats, selected, latency=model, rotate=True
    ):
        runs = runs_by[preset]
        if c.fsspec and rep >= args.fsspec_repeats:
            continue
        if preset != presets[0] and c.key not in report.TAIL_CONTENDERS:
            continue  # no figure of it under the tail is reported
        print(f"  {size_mib} MiB {preset} {c.key} run {rep + 1}: save", end="", flush=True)
        saved = run_one(emu, c, "save", rep, args, bench_py, size_mib)
        digests = saved.pop("digests")
        if digests is not None:
            if c.dcp not in expected:
                expected[c.dcp] = digests
            elif digests != expected[c.dcp]:
                raise SystemExit(f"{c.key}: the generated state dict differs")
        runs[c.key]["save"].append(saved)
        print(f" {saved['wall_s']:.2f} s, load", end="", flush=True)
        loaded = run_one(emu, c, "load", rep, args, bench_py, size_mib)
        loaded["mismatched"] = report.check_load(c, loaded, expected)
        runs[c.key]["load"].append(loaded)
        report.delete_prefix(emu, BUCKET, f"{c.key}/")
        status = "ok" if not loaded["mismatched"] else f"{loaded['mismatched']} DIFFER"
        print(f" {loaded['wall_s']:.2f} s, {status}", flush=True)
    return runs_by


def select(args: argparse.Namespace, bench_py: str | None, notes: list[str]) -> list[Contender]:
    """The contenders ``--only`` names that this machine has the environments for."""
    selected = [c for c in CONTENDERS if not args.only or c.key in args.only.split(",")]
    if bench_py is None:
        notes.append("dataflux and google-cloud-storage skipped: no .venv-bench")
        print(f"{notes[-1]} (run benchmarks/setup_bench_env.sh)")
        selected = [c for c in selected if not c.bench_env]
    if h.fsspec_python() is None:
        notes.append("gcsfs and torch's fsspec DCP skipped: no .venv-gcsfs")
        print(f"{notes[-1]} (run benchmarks/setup_bench_env.sh)")
        selected = [c for c in selected if not c.fsspec]
    elif any(c.fsspec for c in selected):
        notes.append(
            "gcsfs contenders ran with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false (gcsfs 2026.x "
            "otherwise first asks a gRPC API what kind of bucket it is; an HTTP-only endpoint "
            "never answers)"
        )
        print(notes[-1])
    return selected


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench_py = h.bench_python()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    notes: list[str] = []
    selected = select(args, bench_py, notes)
    size = args.size_mib * MiB
    print(
        f"checkpoint ({mode}): state dict of {args.size_mib} MiB, latency "
        f"{' and '.join(args.presets)} (alternated repeat by repeat), "
        f"every load checked tensor by tensor; DCP on {args.ranks} ranks (gloo); "
        f"{args.repeats} save+load per contender ({args.fsspec_repeats} for gcsfs and "
        "torch's fsspec DCP), medians."
    )
    from torchbucket.emulator import PRESETS

    def model(preset: str) -> Any:
        if not args.bandwidth:
            return preset
        return dataclasses.replace(PRESETS[preset], bandwidth=args.bandwidth)

    if args.bandwidth:
        notes.append(f"latency models with {args.bandwidth:g} bytes/s per body")
    if args.tb_config:
        notes.append(f"torchbucket CheckpointConfig: {args.tb_config}")
    large = [c for c in selected if c.key in report.LARGE_CONTENDERS] if args.large_mib else []
    if large:
        print(
            f"then a {args.large_mib} MiB state dict for {', '.join(c.key for c in large)} "
            f"under {args.presets[0]} ({args.large_repeats} repeats)"
        )
    with h.emulator(latency=model(args.presets[0])) as emu:
        emu.create_bucket(BUCKET)
        runs_by = run_size(emu, args, bench_py, args.size_mib, selected, args.presets, model)
    large_runs = run_large(args, bench_py, large, model, run_one, BUCKET, notes) if large else {}

    summaries = {
        preset: {
            c.key: {
                op: report.summarize(runs_by[preset][c.key][op], size) for op in ("save", "load")
            }
            for c in selected
        }
        for preset in args.presets
    }
    for by_contender in summaries.values():
        report.add_floor_fractions(by_contender)
    large_summary = {
        key: {op: report.summarize(ops[op], args.large_mib * MiB) for op in ("save", "load")}
        for key, ops in large_runs.items()
    }
    report.add_floor_fractions(large_summary)
    summary = summaries[args.presets[0]]

    result = report.speedups(summaries, args.presets)
    result.update(report.floor_result(summary))
    result.update(zonal.case(args))  # zonal (Rapid) buckets over gRPC: _ckpt_zonal.py
    suffixes = [""]
    if large_summary:
        result.update(report.large_result(large_summary, args.large_mib))
        suffixes.append(f"_{args.large_mib}mib")
    result = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    result["goals"] = report.goals(result, suffixes)
    result.update(mode=mode, size_mib=args.size_mib, repeats=args.repeats, ranks=args.ranks)
    if large_summary:
        result.update(large_mib=args.large_mib, large_repeats=args.large_repeats)
        result["large_skipped"] = [n for n in notes if " skipped: " in n]
    result["fsspec_repeats"] = min(args.fsspec_repeats, args.repeats)
    if any(c.fsspec for c in selected):
        result["fsspec_versions"] = h.package_versions(
            h.fsspec_python(), ("gcsfs", "fsspec", "torch")
        )
        result["fsspec_env"] = FSSPEC_ENV
    if args.bandwidth:
        result["bandwidth"] = args.bandwidth
    if args.tb_config:
        result["tb_config"] = args.tb_config

    report.print_report(args, selected, large, summary, large_summary, result)

    png = report.figure(args, selected, summary)
    path = report.write(
        result, summaries, args.presets[0], large_summary, large_runs, runs_by, selected, notes, png
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
