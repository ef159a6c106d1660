"""Packed shards benchmark (issue 17): one epoch of small samples, packed or not, side by side.

Against the emulator's model store behind the ``same-region`` latency model
(20 ms to the first byte of a GET, 40 ms per write/compose/delete, 60 ms per
list page, 200 MB/s per body), samples ``<prefix>/<n>.bin`` are packed once
with ``torchbucket.shards.pack`` (32 MiB shards, ``group_by="key"``; the pack
is setup, its time reported apart), then one epoch through
``DataLoader(num_workers=2, batch_size=64)`` of:

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
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_contenders"))

from _common import expected_bytes

import _harness as h

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
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 2 if args.quick else 3
    return args


def datasets_for(args: argparse.Namespace) -> list[DataSet]:
    if args.smoke:
        return [DataSet("10kib", 600, 10 << 10), DataSet("100kib", 120, 100 << 10)]
    if args.quick:
        return [DataSet("10kib", 20_000, 10 << 10), DataSet("100kib", 4_000, 100 << 10)]
    return [DataSet("10kib", 100_000, 10 << 10), DataSet("100kib", 20_000, 100 << 10)]


def seed(emu: Any, ds: DataSet) -> None:
    """Objects ``s/<n>.bin`` whose bytes the contenders' Verifier checks."""
    emu.create_bucket(ds.bucket)
    batch: dict[str, bytes] = {}
    for i in range(ds.count):
        name = f"{PREFIX}{i:08d}.bin"
        batch[name] = expected_bytes(name, ds.size)
        if len(batch) * ds.size >= 64 << 20:
            emu.seed(ds.bucket, batch)
            batch = {}
    if batch:
        emu.seed(ds.bucket, batch)


def pack_set(emu: Any, ds: DataSet, shard_size: int) -> dict[str, Any]:
    from torchbucket.shards import PackConfig, pack
    from torchbucket.storage.gcs import GCSConfig

    gcs = GCSConfig(endpoint=emu.endpoint, anonymous=True)
    emu.reset_stats()
    t0 = time.perf_counter()
    result = pack(
        f"gs://{ds.bucket}/{PREFIX}",
        f"gs://{ds.bucket}/{SHARDS}",
        config=PackConfig(shard_size=shard_size),
        gcs=gcs,
        progress=False,
    )
    seconds = time.perf_counter() - t0
    stats = emu.stats()
    return {
        "seconds": seconds,
        "shards": len(result.shards),
        "bytes": result.bytes,
        "class_a": stats["by_class"].get("A", 0),
        "class_b": stats["by_class"].get("B", 0),
        "names": [SHARDS + s.name for s in result.shards],
    }


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
        "bucket": ds.bucket,
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
        "by_op": server["by_op"],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if not runs:
        return {}
    out: dict[str, Any] = {
        k: h.median([r[k] for r in runs])
        for k, v in runs[0].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    out["by_op"] = runs[-1]["by_op"]
    out["repeats"] = len(runs)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
        f"batch_size={BATCH_SIZE}), same-region latency model, every byte checked, "
        f"{args.repeats} run(s) per contender, medians.\n"
        f"  datasets: {', '.join(d.label for d in sets)}"
        + (" (scaled down from 100,000 x 10 KiB and 20,000 x 100 KiB)" if mode != "full" else "")
        + f"; shards of {shard_size >> 20} MiB packed once (setup).\n"
        "  webdataset reads gs:// through fsspec.open (gcsfs) with "
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false set (gcsfs 2026.x otherwise asks a gRPC "
        "API for the bucket type first, which an HTTP-only endpoint never answers)."
    )
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    packs: dict[str, dict[str, Any]] = {}
    with h.emulator(latency="same-region") as emu:
        for ds in sets:
            seed(emu, ds)
            packs[ds.key] = pack_set(emu, ds, shard_size)
            print(
                f"  {ds.key}: packed {packs[ds.key]['shards']} shards in "
                f"{packs[ds.key]['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in selected}
            for rep in range(args.repeats):
                for c in selected:
                    print(
                        f"  {ds.key} {c.key} run {rep + 1} ...", end="", file=sys.stderr, flush=True
                    )
                    r = run_one(emu, ds, c, rep, packs[ds.key]["names"], bench_py, args.timeout)
                    runs[c.key].append(r)
                    print(f" {r['samples_per_s']:,.0f} samples/s", file=sys.stderr, flush=True)
            summaries[ds.key] = {k: summarize(v) for k, v in runs.items()}

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
        rows = [{"contender": c.label, **s[c.key]} for c in CONTENDERS if s.get(c.key)]
        h.print_table(
            f"{ds.label} (medians; {packs[ds.key]['shards']} shards, packed in "
            f"{packs[ds.key]['seconds']:.1f} s):",
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
            f"{title}, {d.label}",
            labels,
            [summaries[d.key].get(k, {}).get(field_name) for k in keys],
            unit,
        )
        for field_name, title, unit in (
            ("samples_per_s", "Samples/s", "samples/s"),
            ("client_cpu_ms_per_sample", "Client CPU per sample", "ms"),
        )
        for d in sets
    ]
    png = h.bar_chart(NAME, panels, ncols=len(sets), suptitle="One epoch, packed vs not")
    path = h.write_json(
        NAME,
        {
            "result": result,
            "summary": summaries,
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
