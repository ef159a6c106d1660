"""Packed shards benchmark (issue 17): one epoch of small samples, packed or not, side by side.

Against the emulator's model store behind the ``same-region`` latency model
(20 ms to the first byte of a GET, 40 ms per write/compose/delete, 60 ms per
list page, 200 MB/s per body), then behind ``same-region-tail`` (see below),
samples ``<prefix>/<n>.bin`` are packed once per dataset with
``torchbucket.shards.pack`` (32 MiB shards, ``group_by="key"``; the pack is
setup, under the first preset, its time reported apart), then one epoch
through ``DataLoader(num_workers=2, batch_size=64)`` of:

- torchbucket ``BucketShardDataset`` over the shards;
- torchbucket ``BucketIterableDataset`` over the unpacked objects, compose on
  (its best path for small objects);
- the ``webdataset`` package over the same shards through fsspec (gcsfs)
  URLs, in ``.venv-gcsfs`` (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` set:
  gcsfs 2026.x otherwise first asks a gRPC API what kind of bucket it is and
  times out on an HTTP-only endpoint).

Every byte of every sample is checked in the consumer. Datasets: 100,000 x
10 KiB and 20,000 x 100 KiB; ``--quick`` scales them to 20,000 x 10 KiB and
4,000 x 100 KiB (the run says so) and runs each contender twice; the full run
three times. Reported per contender: samples/s, client CPU per sample (all
its processes), requests by class (A: writes, lists, compose, delete; B:
reads) during the epoch and per sample, the first batch's latency (worker
start-up included), and the emulator's own CPU.

Ends with ``RESULT {json}``. Goals: >= 2x torchbucket's compose path at
10 KiB, >= 3x webdataset over gcsfs, <= 0.01 requests per sample, first batch
<= 0.5 s.

Latency (issue 19): ``--latency`` takes presets alternated repeat by repeat
(``_harness.alternating_runs``) against the same buckets and shards, by
default ``same-region`` (constant) and
``same-region-tail`` (the same medians, a log-normal tail with p99 = 5x and 1
request in 1,000 stalled 2 s; see ``torchbucket.emulator._latency``), one
table per preset. The first preset's figures are the keys above; RESULT adds,
per dataset (``10kib``, ``100kib``), ``tail_slowdown_shards_*``,
``tail_slowdown_compose_*`` and ``tail_slowdown_webdataset_*`` (samples/s
under the first preset over under the last: 1.0 means the tail costs
nothing), ``speedup_vs_webdataset_tail_*`` (the packed reader over webdataset
under the last preset), ``hedged_request_fraction_*`` (hedged GETs over the
shard dataset's GETs under the last preset, only where the dataset reports
``last_epoch_stats``), and ``latency_presets``.

Zonal (Rapid) buckets (issue 42): ``--zonal`` runs that case alone, on an
emulator that also serves gRPC, under the first ``--latency`` preset. The
shards are packed on the regional bucket and copied byte for byte to a zonal
one (setup: torchbucket's own pack on a zonal bucket writes each shard as a
data object under a pointer, which only torchbucket reads), with the unpacked
objects seeded there too. Contenders: ``BucketShardDataset`` on the zonal
bucket over gRPC, webdataset over gcsfs's ``ZonalFile`` on the same gRPC
endpoint, torchbucket's defaults over the unpacked objects there (no compose
on a zonal bucket), and ``BucketShardDataset`` on the regional bucket. It
writes ``shards_zonal.json`` and ends with ``RESULT``:
``speedup_vs_gcsfs_zonal_shards_*`` (goal >= 2),
``speedup_zonal_vs_regional_shards_*``, ``speedup_packed_vs_unpacked_zonal_*``,
``client_cpu_ms_per_mib_*`` and ``server_cpu_ms_per_mib_*`` (the emulator's).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import _zonal_common as zc
from _shards_setup import copy_prefix, pack_set, seed

NAME = "shards"
PREFIX = "s/"
SHARDS = "packed/"
SHARD_SIZE = 32 << 20
BATCH_SIZE = 64
NUM_WORKERS = 2


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    script: str
    bench_env: bool
    spec: dict[str, Any] = field(default_factory=dict)


CONTENDERS = [
    Contender("tb_shards", "torchbucket BucketShardDataset (packed)", "shards_loader.py", False,
              {"kind": "shards"}),
    Contender("tb_compose", "torchbucket iterable, compose (unpacked)", "shards_loader.py", False,
              {"kind": "compose"}),
    Contender("wds_gcsfs", "webdataset over gcsfs (packed)", "wds_gcsfs_loader.py", True, {}),
]  # fmt: skip

#: ``--zonal`` (issue 42): the packed shards on a zonal bucket, read by
#: torchbucket over gRPC and by webdataset over gcsfs on the same gRPC endpoint;
#: torchbucket's defaults over the unpacked objects there (no compose on a zonal
#: bucket); the packed shards on the regional bucket over the JSON API.
ZONAL_CONTENDERS = [
    Contender("tb_shards_zonal", "torchbucket BucketShardDataset (packed), zonal (gRPC)",
              "shards_loader.py", False, {"kind": "shards", "zonal": True, "family": zc.TB}),
    Contender("wds_gcsfs_zonal", "webdataset over gcsfs (packed), zonal (gRPC)",
              "wds_gcsfs_loader.py", True, {"zonal": True, "family": zc.GCSFS}),
    Contender("tb_iter_zonal", "torchbucket iterable, defaults (unpacked), zonal (gRPC)",
              "shards_loader.py", False, {"kind": "iterable", "zonal": True, "family": "unpacked"}),
    Contender("tb_shards_regional", "torchbucket BucketShardDataset (packed), regional (JSON API)",
              "shards_loader.py", False, {"kind": "shards", "family": zc.REGIONAL}),
]  # fmt: skip


@dataclass(frozen=True)
class DataSet:
    key: str
    count: int
    size: int

    @property
    def bucket(self) -> str:
        return f"sh-{self.key}"

    @property
    def label(self) -> str:
        return f"{self.count:,} x {self.size // 1024} KiB"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="20,000 x 10 KiB, 4,000 x 100 KiB")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes (a code-path check)")
    p.add_argument("--repeats", type=int, default=None, help="runs per contender")
    p.add_argument("--only", default=None, help="comma-separated contender keys")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per contender run")
    p.add_argument(
        "--zonal",
        action="store_true",
        help="the zonal (Rapid) case alone (issue 42): the packed shards on a zonal bucket, "
        "torchbucket over gRPC against webdataset over gcsfs on the same gRPC endpoint, and "
        "torchbucket on the regional bucket, under the first --latency preset",
    )
    h.add_latency_option(p)
    args = p.parse_args(argv)
    args.presets = h.latency_presets(p, args)
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 2 if args.quick else 3
    return args


def datasets_for(args: argparse.Namespace) -> list[DataSet]:
    if args.smoke:
        return [DataSet("10kib", 600, 10 << 10), DataSet("100kib", 120, 100 << 10)]
    if args.quick:
        return [DataSet("10kib", 20_000, 10 << 10), DataSet("100kib", 4_000, 100 << 10)]
    return [DataSet("10kib", 100_000, 10 << 10), DataSet("100kib", 20_000, 100 << 10)]


def run_one(
    emu: Any,
    ds: DataSet,
    c: Contender,
    rep: int,
    shards: list[str],
    bench_py: str | None,
    timeout: float,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "endpoint": emu.endpoint,
        **zc.spec_for(emu, ds.bucket, c.spec.get("zonal", False)),
        "prefix": PREFIX,
        "shards_prefix": SHARDS,
        "shards": shards,
        "count": ds.count,
        "size": ds.size,
        "batch_size": BATCH_SIZE,
        "num_workers": NUM_WORKERS,
        "pid_file": str(Path(tempfile.gettempdir()) / f"tb-bench-{os.getpid()}-{c.key}.pids"),
        **c.spec,
    }
    env = {"STORAGE_EMULATOR_HOST": emu.endpoint}
    if c.bench_env:
        env.update(GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false", FSSPEC_GCS_TOKEN="anon")
    run = h.run_contender(
        f"sh-{ds.key}-{c.key}-{rep}",
        c.script,
        spec,
        python=bench_py if c.bench_env else None,
        env=env,
        timeout=timeout,
    )
    d = run.data
    n = d["objects"]
    server = d["server"]
    return {
        "samples_per_s": n / d["wall_s"],
        "steady_samples_per_s": d.get("steady_samples_per_s") or math.nan,
        "first_batch_s": d.get("first_batch_s", math.nan),
        "samples": n,
        "wall_s": d["wall_s"],
        "class_a": server["class_a"],
        "class_b": server["class_b"],
        "requests_per_sample": (server["class_a"] + server["class_b"]) / n,
        "client_cpu_ms_per_sample": d["cpu_s"] / n * 1e3,
        "server_cpu_s": server["cpu_s"],
        "server_cpu_ms_per_sample": server["cpu_s"] / n * 1e3,
        "peak_rss_worker_mb": run.peak_rss_worker_mb,
        # Datasets with last_epoch_stats only: second GETs of slow reads, and the GETs.
        "hedges": d.get("hedges", math.nan),
        "client_gets": d.get("client_gets", math.nan),
        "by_op": server["by_op"],
    }


def print_table(
    ds: DataSet, preset: str, summary: dict[str, dict[str, Any]], pack: dict[str, Any]
) -> None:
    """One dataset's contenders under one latency preset."""
    rows = [{"contender": c.label, **summary[c.key]} for c in CONTENDERS if summary.get(c.key)]
    h.print_table(
        f"{ds.label}, latency {preset} (medians; {pack['shards']} shards, packed in "
        f"{pack['seconds']:.1f} s):",
        rows,
        [
            ("contender", "contender", "s"),
            ("samples_per_s", "samples/s", ",.0f"),
            ("first_batch_s", "first batch s", ".3f"),
            ("client_cpu_ms_per_sample", "client CPU ms/sample", ".3f"),
            ("class_a", "class A", ",.0f"),
            ("class_b", "class B", ",.0f"),
            ("requests_per_sample", "requests/sample", ".4f"),
            ("server_cpu_s", "emulator CPU s", ".2f"),
            ("repeats", "runs", "d"),
        ],
    )


#: RESULT's name for each contender in ``tail_slowdown_<name>_<dataset>``.
TAIL_NAMES = {"tb_shards": "shards", "tb_compose": "compose", "wds_gcsfs": "webdataset"}


def tail_figures(
    result: dict[str, Any],
    by_preset: dict[str, dict[str, dict[str, dict[str, Any]]]],
    presets: list[str],
    sets: list[DataSet],
) -> None:
    """Add the latency-tail figures (issue 19) to ``result`` and print them in one line.

    Each contender's samples/s under the first preset over under the last (1.0:
    the tail costs nothing), the packed reader's lead over webdataset under the
    last, and the share of the shard dataset's GETs that were hedges under the
    last (only where the dataset reports them).
    """
    result["latency_presets"] = presets
    if len(presets) < 2:
        return
    base, tail = presets[0], presets[-1]
    parts = []
    for ds in sets:
        under = {p: by_preset[p].get(ds.key, {}) for p in (base, tail)}
        rate = {
            (p, key): under[p].get(key, {}).get("samples_per_s", math.nan)
            for p in (base, tail)
            for key in TAIL_NAMES
        }
        slowdowns = []
        for key, name in TAIL_NAMES.items():
            slowdown = round(h.ratio(rate[(base, key)], rate[(tail, key)]), 3)
            result[f"tail_slowdown_{name}_{ds.key}"] = slowdown
            slowdowns.append(f"{name} {slowdown}x")
        lead = round(h.ratio(rate[(tail, "tb_shards")], rate[(tail, "wds_gcsfs")]), 2)
        result[f"speedup_vs_webdataset_tail_{ds.key}"] = lead
        shards = under[tail].get("tb_shards", {})
        # nan (no last_epoch_stats, or no GETs): no key.
        fraction = h.ratio(shards.get("hedges", math.nan), shards.get("client_gets", math.nan))
        hedged = ""
        if not math.isnan(fraction):
            fraction = round(fraction, 4)
            result[f"hedged_request_fraction_{ds.key}"] = fraction
            hedged = f", {fraction:.2%} of its GETs hedged"
        parts.append(
            f"{ds.label}: {', '.join(slowdowns)} (packed {lead}x webdataset under the tail{hedged})"
        )
    print(f"\ntail slowdown ({tail} against {base}): " + "; ".join(parts))


def setup_zonal(emu: Any, ds: DataSet, shard_size: int, preset: str) -> dict[str, Any]:
    """Seed and pack ``ds`` on its regional bucket, then its zonal copy (setup, timed apart).

    The zonal bucket gets the same unpacked objects (seeded) and the same
    shards, manifest and indexes, copied byte for byte (:func:`copy_prefix`).
    """
    emu.set_latency(preset)
    seed(emu, ds.bucket, prefix=PREFIX, count=ds.count, size=ds.size)
    pack = pack_set(emu, ds.bucket, prefix=PREFIX, shards_prefix=SHARDS, shard_size=shard_size)
    zonal = zc.zonal_bucket(ds.bucket)
    seed(emu, zonal, prefix=PREFIX, count=ds.count, size=ds.size, zonal=True)
    copy_prefix(emu, ds.bucket, zonal, SHARDS)
    print(
        f"  {ds.key}: packed {pack['shards']} shards in {pack['seconds']:.1f} s, "
        "copied to the zonal bucket",
        file=sys.stderr,
        flush=True,
    )
    return pack


def run_zonal(args: argparse.Namespace) -> int:
    """``--zonal``: the zonal case alone (issue 42 point 6), under the first preset."""
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    selected = [c for c in ZONAL_CONTENDERS if not args.only or c.key in args.only.split(",")]
    bench_py = h.fsspec_python()
    if bench_py is None:
        print("webdataset skipped: run benchmarks/setup_bench_env.sh")
        selected = [c for c in selected if not c.bench_env]
    sets = datasets_for(args)
    shard_size = (1 << 20) if args.smoke else SHARD_SIZE
    preset = args.presets[0]
    print(
        f"shards --zonal ({mode}): one epoch, DataLoader(num_workers={NUM_WORKERS}, "
        f"batch_size={BATCH_SIZE}), latency {preset} on HTTP and gRPC alike, every byte "
        f"checked, {args.repeats} run(s) per contender, interleaved, medians.\n"
        f"  datasets: {', '.join(d.label for d in sets)}; shards of {shard_size >> 20} MiB "
        "packed once on the regional bucket and copied to the zonal one (setup)."
    )
    labels = {c.key: c.label for c in selected}
    families = {c.key: c.spec["family"] for c in selected}
    result: dict[str, Any] = {"mode": mode, "latency": preset, "shard_size": shard_size}
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    with h.emulator(latency=preset, grpc=True) as emu:
        for ds in sets:
            pack = setup_zonal(emu, ds, shard_size, preset)
            runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in selected}
            for rep, _, c in h.alternating_runs(emu, [preset], args.repeats, selected):
                print(f"  {ds.key} {c.key} run {rep + 1} ...", end="", file=sys.stderr, flush=True)
                r = run_one(emu, ds, c, rep, pack["names"], bench_py, args.timeout)
                runs[c.key].append(r)
                print(f" {r['samples_per_s']:,.0f} samples/s", file=sys.stderr, flush=True)
            summary = summaries[ds.key] = {k: h.median_figures(v) for k, v in runs.items()}
            per: dict[str, Any] = {
                "size": ds.size,
                "cpu": "client_cpu_ms_per_sample",
                "server": "server_cpu_ms_per_sample",
            }
            title = f"{ds.label}, latency {preset} ({pack['shards']} shards; medians):"
            zc.print_table(title, summary, labels, **per)
            name = f"shards_{ds.key}"
            zc.figures(result, summary, families, name=name, **per)
            unpacked = (summary.get("tb_iter_zonal") or {}).get("samples_per_s", math.nan)
            best = summary.get(result[f"best_zonal_{name}"] or "", {})
            result[f"speedup_packed_vs_unpacked_zonal_{ds.key}"] = round(
                h.ratio(best.get("samples_per_s", math.nan), unpacked), 2
            )
    result["goals"] = {
        "speedup_vs_gcsfs_zonal_shards_ge_2": all(
            (result.get(f"speedup_vs_gcsfs_zonal_shards_{d.key}") or 0) >= 2 for d in sets
        )
    }
    if any(c.bench_env for c in selected):
        result["fsspec_versions"] = h.package_versions(
            bench_py, ("gcsfs", "fsspec", "webdataset", "google-cloud-storage", "grpcio")
        )
    for d in sets:
        print(
            f"{d.label}: torchbucket's packed shards on the zonal bucket are "
            f"{result[f'speedup_vs_gcsfs_zonal_shards_{d.key}']}x webdataset over gcsfs there, "
            f"{result[f'speedup_packed_vs_unpacked_zonal_{d.key}']}x the unpacked objects, and "
            f"{result[f'speedup_zonal_vs_regional_shards_{d.key}']}x the same shards on the "
            "regional bucket"
        )
    path = h.write_json(
        f"{NAME}_zonal",
        {"result": result, "summary": summaries, "contenders": labels, "families": families},
    )
    print(f"wrote {h.rel(path)}")
    h.emit_result(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.zonal:
        return run_zonal(args)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    # webdataset + gcsfs live in .venv-gcsfs (gcsfs 2026.x needs google-cloud-storage>=3).
    bench_py = h.fsspec_python()
    selected = [c for c in CONTENDERS if not args.only or c.key in args.only.split(",")]
    if bench_py is None:
        print("webdataset skipped: run benchmarks/setup_bench_env.sh")
        selected = [c for c in selected if not c.bench_env]
    sets = datasets_for(args)
    shard_size = (1 << 20) if args.smoke else SHARD_SIZE
    print(
        f"shards ({mode}): one epoch, DataLoader(num_workers={NUM_WORKERS}, "
        f"batch_size={BATCH_SIZE}), latency {' and '.join(args.presets)} "
        "(alternated repeat by repeat), every byte checked, "
        f"{args.repeats} run(s) per contender, medians.\n"
        f"  datasets: {', '.join(d.label for d in sets)}"
        + (" (scaled down from 100,000 x 10 KiB and 20,000 x 100 KiB)" if mode != "full" else "")
        + f"; shards of {shard_size >> 20} MiB packed once (setup).\n"
        "  webdataset reads gs:// through fsspec.open (gcsfs) with "
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false set (gcsfs 2026.x otherwise asks a gRPC "
        "API for the bucket type first, which an HTTP-only endpoint never answers)."
    )
    packs: dict[str, dict[str, Any]] = {}
    # Per latency preset: dataset -> contender -> summary (the first preset's is ``summaries``).
    by_preset: dict[str, dict[str, dict[str, dict[str, Any]]]] = {p: {} for p in args.presets}
    with h.emulator(latency=args.presets[0]) as emu:
        for ds in sets:
            # Setup, once per dataset and under the first preset: every preset
            # reads the same shards.
            emu.set_latency(args.presets[0])
            seed(emu, ds.bucket, prefix=PREFIX, count=ds.count, size=ds.size)
            packs[ds.key] = pack_set(
                emu, ds.bucket, prefix=PREFIX, shards_prefix=SHARDS, shard_size=shard_size
            )
            print(
                f"  {ds.key}: packed {packs[ds.key]['shards']} shards in "
                f"{packs[ds.key]['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            runs_by: dict[str, dict[str, list[dict[str, Any]]]] = {
                p: {c.key: [] for c in selected} for p in args.presets
            }
            for rep, preset, c in h.alternating_runs(emu, args.presets, args.repeats, selected):
                print(
                    f"  {preset} {ds.key} {c.key} run {rep + 1} ...",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
                names = packs[ds.key]["names"]
                r = run_one(emu, ds, c, rep, names, bench_py, args.timeout)
                runs_by[preset][c.key].append(r)
                print(f" {r['samples_per_s']:,.0f} samples/s", file=sys.stderr, flush=True)
            for preset, runs in runs_by.items():
                by_preset[preset][ds.key] = {k: h.median_figures(v) for k, v in runs.items()}
    summaries = by_preset[args.presets[0]]

    result: dict[str, Any] = {"mode": mode, "repeats": args.repeats}
    for ds in sets:
        s = summaries[ds.key]
        tb = s.get("tb_shards", {})
        rate = tb.get("samples_per_s", math.nan)
        result[f"samples_per_s_shards_{ds.key}"] = round(rate) if tb else None
        result[f"speedup_vs_compose_{ds.key}"] = round(
            h.ratio(rate, s.get("tb_compose", {}).get("samples_per_s", math.nan)), 2
        )
        result[f"speedup_vs_webdataset_{ds.key}"] = round(
            h.ratio(rate, s.get("wds_gcsfs", {}).get("samples_per_s", math.nan)), 2
        )
        result[f"requests_per_sample_{ds.key}"] = tb.get("requests_per_sample")
        result[f"first_batch_s_{ds.key}"] = tb.get("first_batch_s")
        result[f"client_cpu_ms_per_sample_{ds.key}"] = tb.get("client_cpu_ms_per_sample")
        result[f"pack_s_{ds.key}"] = round(packs[ds.key]["seconds"], 2)
        for preset in args.presets:
            print_table(ds, preset, by_preset[preset][ds.key], packs[ds.key])
    tail_figures(result, by_preset, args.presets, sets)
    result["goals"] = {
        "speedup_vs_compose_10kib_ge_2": (result.get("speedup_vs_compose_10kib") or 0) >= 2,
        "speedup_vs_webdataset_ge_3": all(
            (result.get(f"speedup_vs_webdataset_{d.key}") or 0) >= 3 for d in sets
        ),
        "requests_per_sample_le_0_01": all(
            (result.get(f"requests_per_sample_{d.key}") or math.inf) <= 0.01 for d in sets
        ),
        "first_batch_le_0_5_s": all(
            (result.get(f"first_batch_s_{d.key}") or math.inf) <= 0.5 for d in sets
        ),
    }
    result.update(
        datasets={d.key: {"count": d.count, "size": d.size} for d in sets},
        shard_size=shard_size,
        gcsfs_zb_hns_support_disabled=True,
    )
    keys = [c.key for c in CONTENDERS if any(summaries[d.key].get(c.key) for d in sets)]
    labels = [next(c.label for c in CONTENDERS if c.key == k) for k in keys]
    panels = [
        h.Panel(
            f"{title}, {d.label}, {preset}",
            labels,
            [by_preset[preset][d.key].get(k, {}).get(field_name) for k in keys],
            unit,
        )
        for field_name, title, unit, presets in (
            ("samples_per_s", "Samples/s", "samples/s", args.presets),
            ("client_cpu_ms_per_sample", "Client CPU per sample", "ms", args.presets[:1]),
        )
        for preset in presets
        for d in sets
    ]
    png = h.bar_chart(NAME, panels, ncols=len(sets), suptitle="One epoch, packed vs not")
    path = h.write_json(
        NAME,
        {
            "result": result,
            "summary": summaries,
            "summary_by_preset": by_preset,
            "pack": {
                k: {kk: vv for kk, vv in v.items() if kk != "names"} for k, v in packs.items()
            },
            "contenders": {c.key: c.label for c in CONTENDERS},
            "figure": h.rel(png),
        },
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
