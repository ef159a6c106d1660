"""Where a short epoch's time goes (issue 19): the prefetch window's timeline, traced.

``dataloading.py --quick``'s 10 KiB dataset is 6,000 objects: an epoch of
well under a second, and issue 19's ``tail_slowdown_10kib`` is still above
1.15 on it while longer epochs stay within it (``tail_epochs.py``). This
benchmark shows where the wait goes. It runs torchbucket's two small-object
paths, the iterable dataset and the map-style dataset with
``BucketBatchSampler`` (compose on, ``bytes`` samples,
``DataLoader(num_workers=2, batch_size=64)``, every byte checked in the
loop as ``dataloading.py``'s contenders do), under ``same-region`` and
``same-region-tail`` alternated repeat by repeat (``_harness.alternating_runs``,
a fresh seeded sampler per run). Each DataLoader worker logs its prefetch
window's timeline at DEBUG (``torchbucket.datasets._fetch``: the window's
start, every unit's fetch, every wait of the worker's consumer) to a file of
its own. Per worker, this script splits the consumer's waits at the moment
the window's first composed group arrived:

- start-up: waiting for the first objects (read directly, ``_DIRECT_START``)
  and for the first composed group, whose path is a chain of round trips
  (the window's anchor upload, the compose, the composite's GET; the
  bucket's soft-delete policy was read when the dataset was built);
- steady: every wait after that (a group at the window's head still in
  flight when the consumer reached it).

``--quick``: 6,000 x 10 KiB, 6 repeats (about a minute on the 2-core VM);
the full run: 20,000 objects, 8 repeats. ``--smoke``: 512 objects, one
repeat (a code-path check). ``--size-kib`` and ``--count`` trace another
dataset (``sizes.py``'s composed sizes: ``--size-kib 64 --count 18000``, or
``--size-kib 0.5 --count 48000`` for its 512 B).
No goal of its own: issue 19's goal is ``dataloading.py``'s
``tail_slowdown_10kib``; this says what it is made of.

Ends with ``RESULT {json}``: per path (``iterable``, ``map``) and preset
(``same_region``, ``same_region_tail``), medians over the runs of
``samples_per_s``, ``epoch_s``, ``first_group_s`` (window start to its first
composed group's arrival, per worker), ``startup_wait_s`` and
``steady_wait_s`` (the consumer's waits, summed per worker, the workers'
mean), ``group_path_p50_s`` and ``group_path_p90_s`` (a composed group's
fetch, start to arrival), and per path ``tail_slowdown_<path>``,
``tail_startup_wait_s_<path>`` / ``tail_steady_wait_s_<path>`` (what the tail
added to each, medians' difference), and ``server_cpu_fraction_max`` (the
emulator's CPU seconds over an epoch's wall time, the highest of the runs:
below 1, the server was not the bottleneck).
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

sys.path.insert(0, str(h.CONTENDERS_DIR))
from _common import Verifier  # the contenders' byte check

NAME = "window_timeline"
SIZE_KIB = 10  # the default object size
BUCKET = "timeline"
PREFIX = "img/"
BATCH_SIZE = 64
NUM_WORKERS = 2
PATHS = ("iterable", "map")
# The window's timeline, and the epoch's drain (compose/registry.py).
LOGGERS = ("torchbucket.datasets._fetch", "torchbucket.compose.registry")

_START = re.compile(r"^(\S+) window start:")
_UNIT = re.compile(r"^(\S+) window unit at position (\d+): (\d+) objects in (\S+) s")
_WAIT = re.compile(r"^(\S+) window wait (\S+) s for position (\d+)")
_DRAIN = re.compile(r"^(\S+) drain (\S+) s:")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="6,000 x 10 KiB, 6 repeats")
    mode.add_argument("--smoke", action="store_true", help="512 objects, 1 repeat")
    p.add_argument("--count", type=int, default=None, help="objects in the dataset")
    p.add_argument(
        "--size-kib",
        type=float,
        default=SIZE_KIB,
        help=f"object size, KiB, a fraction allowed (0.5: 512 B; default {SIZE_KIB})",
    )
    p.add_argument("--repeats", type=int, default=None, help="runs per path and preset")
    h.add_latency_option(p)
    args = p.parse_args(argv)
    args.presets = h.latency_presets(p, args)
    if len(args.presets) != 2:
        p.error("--latency takes two presets: the constant one, then the tail")
    if not (math.isfinite(args.size_kib) and round(args.size_kib * 1024) >= 1):
        p.error(f"--size-kib must be at least 1 byte (1/1024), got {args.size_kib}")
    args.size = round(args.size_kib * 1024)
    if args.count is None:
        args.count = 512 if args.smoke else 6_000 if args.quick else 20_000
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 6 if args.quick else 8
    return args


def _log_to(directory: str, worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: this worker's window timeline to its own file."""
    handler = logging.FileHandler(os.path.join(directory, f"worker-{worker_id}.log"))
    handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
    for name in LOGGERS:
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(logging.DEBUG)
        log.propagate = False


def worker_timeline(text: str, epoch_start: float) -> dict[str, Any]:
    """One worker's figures from its log: waits split at its first group's arrival.

    ``epoch_start``: the wall-clock time the main process began the epoch.
    """
    start = None
    drains: list[tuple[float, float]] = []  # (ended, seconds)
    groups: list[tuple[float, float]] = []  # (arrived, seconds)
    waits: list[tuple[float, float]] = []  # (ended, seconds)
    for line in text.splitlines():
        if m := _START.match(line):
            start = float(m.group(1))
        elif m := _UNIT.match(line):
            if int(m.group(3)) > 1:
                groups.append((float(m.group(1)), float(m.group(4))))
        elif m := _WAIT.match(line):
            waits.append((float(m.group(1)), float(m.group(2))))
        elif m := _DRAIN.match(line):
            drains.append((float(m.group(1)), float(m.group(2))))
    if start is None:
        raise ValueError("no 'window start' line: was the window's DEBUG log captured?")
    first = min((t for t, _ in groups), default=float("inf"))
    return {
        "worker_start_s": start - epoch_start,
        "drain_s": sum(s for _, s in drains),
        "done_at": max((t for t, _ in drains), default=start),
        "first_group_s": first - start if groups else None,
        "startup_wait_s": sum(s for t, s in waits if t <= first),
        "steady_wait_s": sum(s for t, s in waits if t > first),
        "waits": len(waits),
        "group_paths": [s for _, s in groups],
    }


def run_epoch(
    emu: Any, path: str, seed: int, names: list[str], size: int, log_dir: str
) -> dict[str, Any]:
    """One epoch of ``path`` with every worker's window timeline logged; its figures.

    Every sample is checked against ``names``' generated contents (CRC32C, each
    once), in the loop as ``dataloading.py``'s contenders do.
    """
    from torch.utils.data import DataLoader

    from torchbucket.compose import ComposeConfig
    from torchbucket.datasets import (
        BucketBatchSampler,
        BucketIterableDataset,
        BucketMapDataset,
        FetchConfig,
    )
    from torchbucket.storage.gcs import GCSConfig

    uri = f"gs://{BUCKET}/{PREFIX}"
    gcs = GCSConfig(endpoint=emu.endpoint)
    kwargs: dict[str, Any] = {"batch_size": BATCH_SIZE}
    dataset: Any
    if path == "map":
        dataset = BucketMapDataset.from_prefix(
            uri, gcs=gcs, compose=ComposeConfig(), fetch=FetchConfig()
        )
        kwargs = {"batch_sampler": BucketBatchSampler(dataset, batch_size=BATCH_SIZE, seed=seed)}
    else:
        dataset = BucketIterableDataset.from_prefix(
            uri, gcs=gcs, compose=ComposeConfig(), fetch=FetchConfig()
        )
    loader = DataLoader(
        dataset,
        num_workers=NUM_WORKERS,
        collate_fn=list,
        worker_init_fn=functools.partial(_log_to, log_dir),
        **kwargs,
    )
    verifier = Verifier(names, size)
    emu.reset_stats()
    samples = 0
    epoch_start = time.time()  # the workers' log times are wall-clock times too
    t0 = time.perf_counter()
    for batch in loader:
        for sample in batch:
            verifier.check(sample)
        samples += len(batch)
    wall = time.perf_counter() - t0
    stats = emu.stats()
    verifier.finish()  # every object arrived
    workers = [
        worker_timeline(Path(log_dir, f"worker-{w}.log").read_text(), epoch_start)
        for w in range(NUM_WORKERS)
    ]
    paths = sorted(s for w in workers for s in w["group_paths"])
    return {
        "samples_per_s": samples / wall,
        "epoch_s": wall,
        "first_group_s": statistics.mean(
            w["first_group_s"] for w in workers if w["first_group_s"] is not None
        )
        if any(w["first_group_s"] is not None for w in workers)
        else None,
        "worker_start_s": statistics.mean(w["worker_start_s"] for w in workers),
        "startup_wait_s": statistics.mean(w["startup_wait_s"] for w in workers),
        "steady_wait_s": statistics.mean(w["steady_wait_s"] for w in workers),
        "drain_s": statistics.mean(w["drain_s"] for w in workers),
        # From the last worker's drain to the main process's end of the epoch
        # (the last batches handed over, the workers shut down).
        "after_drain_s": epoch_start + wall - max(w["done_at"] for w in workers),
        "group_path_p50_s": paths[len(paths) // 2] if paths else None,
        "group_path_p90_s": paths[int(0.9 * len(paths))] if paths else None,
        "groups": len(paths),
        "server_cpu_s": float(stats.get("cpu_seconds", 0.0)),
        "stalls": dict(stats.get("stalls", {})),
    }


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return h.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    base, tail = args.presets
    print(
        f"window_timeline ({mode}): one epoch of {args.count:,} x {args.size_kib:g} KiB, "
        f"DataLoader(num_workers={NUM_WORKERS}, batch_size={BATCH_SIZE}), compose on, bytes "
        f"samples, every byte checked; {base} and {tail} alternated repeat by repeat, a fresh seeded sampler per "
        f"run; {args.repeats} run(s) per path and preset, medians. Each worker logs its "
        "prefetch window's timeline at DEBUG; the consumer's waits are split at its first "
        "composed group's arrival."
    )
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with h.emulator(latency=base) as emu, tempfile.TemporaryDirectory() as tmp:
        names = h.seed(emu, BUCKET, count=args.count, size=args.size, prefix=PREFIX)
        for n, (rep, preset, path) in enumerate(
            h.alternating_runs(emu, args.presets, args.repeats, list(PATHS))
        ):
            log_dir = os.path.join(tmp, str(n))
            os.mkdir(log_dir)
            print(f"  {preset} {path} run {rep + 1} ...", end="", file=sys.stderr)
            r = run_epoch(emu, path, rep, names, args.size, log_dir)
            runs.setdefault((path, preset), []).append(r)
            print(
                f" {r['samples_per_s']:,.0f} samples/s, waits {r['startup_wait_s']:.3f} s "
                f"start-up + {r['steady_wait_s']:.3f} s steady",
                file=sys.stderr,
                flush=True,
            )
        leftovers = len(emu.object_names(BUCKET, "dataflux-composed-objects/"))

    result: dict[str, Any] = {}
    rows = []
    figures = (
        "samples_per_s",
        "epoch_s",
        "worker_start_s",
        "first_group_s",
        "startup_wait_s",
        "steady_wait_s",
        "drain_s",
        "after_drain_s",
        "group_path_p50_s",
        "group_path_p90_s",
    )
    server_share = 0.0
    for path in PATHS:
        med = {}
        for preset in (base, tail):
            rs = runs[(path, preset)]
            med[preset] = {k: _median(rs, k) for k in figures}
            server_share = max(server_share, *(r["server_cpu_s"] / r["epoch_s"] for r in rs))
            for k, v in med[preset].items():
                result[f"{k}_{path}_{preset.replace('-', '_')}"] = (
                    None if v is None else round(v, 4)
                )
            rows.append({"path": path, "preset": preset, **med[preset]})
        b, t = med[base], med[tail]
        result[f"tail_slowdown_{path}"] = round(
            h.ratio(b["samples_per_s"] or 0.0, t["samples_per_s"] or 0.0), 3
        )
        for k in (
            "worker_start_s",
            "startup_wait_s",
            "steady_wait_s",
            "drain_s",
            "after_drain_s",
            "epoch_s",
        ):
            result[f"tail_{k}_{path}"] = round((t[k] or 0.0) - (b[k] or 0.0), 4)
    result.update(
        count=args.count,
        object_size=args.size,
        repeats=args.repeats,
        mode=mode,
        latency_presets=[base, tail],
        server_cpu_fraction_max=round(server_share, 3),
        composites_left=leftovers,
    )

    h.print_table(
        f"{args.count:,} x {args.size_kib:g} KiB (medians; waits per worker, summed over its epoch):",
        rows,
        [
            ("path", "path", ""),
            ("preset", "preset", ""),
            ("samples_per_s", "samples/s", ",.0f"),
            ("epoch_s", "epoch s", ".3f"),
            ("worker_start_s", "to window s", ".3f"),
            ("first_group_s", "1st group s", ".3f"),
            ("startup_wait_s", "start-up wait s", ".3f"),
            ("steady_wait_s", "steady wait s", ".3f"),
            ("drain_s", "drain s", ".3f"),
            ("after_drain_s", "after drain s", ".3f"),
            ("group_path_p50_s", "group p50 s", ".3f"),
            ("group_path_p90_s", "group p90 s", ".3f"),
        ],
    )
    print()
    for path in PATHS:
        print(
            f"{path}: the tail slowed the epoch {result[f'tail_slowdown_{path}']}x, "
            f"+{result[f'tail_epoch_s_{path}']:.3f} s; per worker (medians): to the window "
            f"{result[f'tail_worker_start_s_{path}']:+.3f} s, start-up waits "
            f"{result[f'tail_startup_wait_s_{path}']:+.3f} s, steady waits "
            f"{result[f'tail_steady_wait_s_{path}']:+.3f} s, drain "
            f"{result[f'tail_drain_s_{path}']:+.3f} s; after the drains "
            f"{result[f'tail_after_drain_s_{path}']:+.3f} s"
        )
    print(
        f"emulator CPU over wall time, highest run: {server_share:.2f}; composites left: {leftovers}"
    )
    labels = [f"{r['path']} {'tail' if r['preset'] == tail else 'const'}" for r in rows]
    png = h.bar_chart(
        NAME,
        [
            h.Panel("Start-up waits per worker", labels, [r["startup_wait_s"] for r in rows], "s"),
            h.Panel("Steady waits per worker", labels, [r["steady_wait_s"] for r in rows], "s"),
            h.Panel("Drain per worker", labels, [r["drain_s"] for r in rows], "s"),
            h.Panel("Epoch", labels, [r["epoch_s"] for r in rows], "s"),
        ],
        suptitle=f"window_timeline ({mode}): {args.count:,} x {args.size_kib:g} KiB, {base} vs {tail}",
    )
    written = h.write_json(
        NAME,
        {
            "result": result,
            "figure": h.rel(png),
            "rows": rows,
            "runs": {f"{p}/{preset}": v for (p, preset), v in runs.items()},
        },
    )
    print(f"wrote {h.rel(written)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
