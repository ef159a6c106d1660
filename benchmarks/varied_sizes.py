"""Datasets whose objects all differ in size (issue 43): the defaults against the bare loop.

``sizes.py`` gives each dataset one object size; a dataset of images, clips or
documents has nearly as many sizes as objects. This benchmark reads such
datasets: each range's objects take ``distinct`` sizes spread evenly from its
least to its most (seeded by the emulator, one prefix per size, contents that
every contender checks byte for byte), in three ranges:

- ``2-30kib``: 30,000 objects of 3,000 sizes (composed by the defaults);
- ``60-160kib``: 6,000 objects of 3,000 sizes (composed);
- ``512kib-2mib``: 1,200 objects of 1,200 sizes (read one GET each).

Contenders, each in its own process (forked from an interpreter that has
imported torch, as in ``sizes.py``), side by side in one run: torchbucket with
**default settings** (``BucketMapDataset.from_prefix(uri)`` with a
``BucketBatchSampler``, and ``BucketIterableDataset.from_prefix(uri,
shuffle=True)``; ``bytes`` samples, the DataLoader's own ``collate_fn``,
``num_workers=2``, batch 64) and the bare aiohttp loop (256 in flight, one
process: the limit), which reads the first 10,000 objects of a shuffled order
where a range has more. The emulator's ``same-region`` model (constant);
``--quick``: 3 runs each, the order reversed every other repeat (a few
minutes); ``--smoke``: two small ranges, one run.

Why it exists: with one size per dataset, a composite's expected CRC32C took
the length's power of x from a cache; with every length distinct, each of a
compose's 31 sources cost 44-52 us of Python in the DataLoader worker's loop
(``torchbucket.storage.crc32c.combine``), where it now runs in the native
library. Before/after: this benchmark on a snapshot of each.

Ends with ``RESULT {json}``: per range, ``default_fraction_of_limit_<range>``
(the lower default's samples/s over the loop's), ``samples_per_s_<contender>_<range>``,
``client_cpu_ms_per_mib_<range>`` (the higher default's: all its processes,
the consumer's check included) and ``limit_cpu_ms_per_mib_<range>``,
``mean_object_kib_<range>``, ``distinct_sizes_<range>``; and
``server_cpu_fraction_max`` (the emulator's CPU over a run's wall time, the
highest: below 1, the server was not the bottleneck) and ``composites_left``.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import _zygote as zg
import dataloading as dl

NAME = "varied_sizes"
KIB = 1 << 10
MIB = 1 << 20
PREFIX = "v/"
#: The bare loop reads at most this many objects of a range (its rate is per sample).
LIMIT_OBJECTS = 10_000
DEFAULTS = ("map_default", "iter_default")
CONTENDERS = [
    dl.Contender("map_default", "torchbucket map + BucketBatchSampler, defaults", "tb_loader.py",
                 False, "default", {"kind": "map_fast", "collate": "torch"}),
    dl.Contender("iter_default", "torchbucket iterable (shuffle=True), defaults", "tb_loader.py",
                 False, "default", {"kind": "iterable", "collate": "torch", "shuffle": True}),
    dl.Contender("aiohttp", "bare aiohttp loop (limit)", "aiohttp_loop.py", False, "limit"),
]  # fmt: skip


@dataclass(frozen=True)
class Range:
    """A dataset: ``count`` objects of ``distinct`` sizes from ``least`` to ``most`` bytes."""

    key: str
    least: int
    most: int
    count: int
    distinct: int

    def sizes(self) -> list[int]:
        """The ``distinct`` sizes, spread evenly, least and most included."""
        if self.distinct == 1:
            return [self.least]
        step = (self.most - self.least) / (self.distinct - 1)
        return [self.least + round(i * step) for i in range(self.distinct)]

    def objects(self) -> dict[str, int]:
        """Every object's name and size, as ``seed_generated`` names them."""
        from torchbucket.emulator import generated_names

        per = self.count // self.distinct
        out: dict[str, int] = {}
        for size in self.sizes():
            for name in generated_names(f"{PREFIX}{size:08d}/", per):
                out[name] = size
        return out


QUICK = [
    Range("2-30kib", 2 * KIB, 30 * KIB, 30_000, 3_000),
    Range("60-160kib", 60 * KIB, 160 * KIB, 6_000, 3_000),
    Range("512kib-2mib", 512 * KIB, 2 * MIB, 1_200, 1_200),
]
SMOKE = [
    Range("2-30kib", 2 * KIB, 30 * KIB, 600, 300),
    Range("512kib-2mib", 512 * KIB, 2 * MIB, 48, 48),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="three ranges, 3 runs each")
    mode.add_argument("--smoke", action="store_true", help="two small ranges, 1 run")
    p.add_argument("--repeats", type=int, default=None, help="runs per contender and range")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 3 if args.quick else 5
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    args.ranges = SMOKE if args.smoke else QUICK
    return args


def seed_range(emu: Any, r: Range) -> None:
    """Have the emulator generate the range's objects, one prefix per size."""
    bucket = dataset(r).bucket
    emu.create_bucket(bucket)
    per = r.count // r.distinct
    for size in r.sizes():
        emu.seed_generated(bucket, count=per, size=size, prefix=f"{PREFIX}{size:08d}/")


def dataset(r: Range) -> dl.DataSet:
    """The range as ``dataloading.run_one`` takes a dataset (its mean size)."""
    return dl.DataSet(f"vs-{r.key}", r.count, (r.least + r.most) // 2, 0)


def limit_objects(objects: dict[str, int]) -> dict[str, int]:
    """The loop's objects: the first :data:`LIMIT_OBJECTS` of a seeded shuffle."""
    names = sorted(objects)
    random.Random(0).shuffle(names)
    return {n: objects[n] for n in names[:LIMIT_OBJECTS]}


def run_range(
    emu: Any, r: Range, args: argparse.Namespace, zygotes: zg.Zygotes
) -> dict[str, dict[str, Any]]:
    """Every run of one range; contender -> medians, with ``mib_per_obj``."""
    objects = r.objects()
    read_by = {
        c.key: limit_objects(objects) if c.family == "limit" else objects for c in CONTENDERS
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for c in CONTENDERS if rep % 2 == 0 else list(reversed(CONTENDERS)):
            sized = dl.Contender(c.key, c.label, c.script, c.bench_env, c.family,
                                 {**c.spec, "prefix": PREFIX, "sizes": read_by[c.key]})  # fmt: skip
            print(f"  {r.key} {c.key} run {rep + 1} ...", end="", file=sys.stderr, flush=True)
            out = dl.run_one(emu, dataset(r), sized, rep, None, args.timeout, zygotes=zygotes)
            runs.setdefault(c.key, []).append(out)
            print(f" {out['samples_per_s']:,.0f} samples/s", file=sys.stderr, flush=True)
    summary = {k: dl.summarize(v) for k, v in runs.items()}
    for c in CONTENDERS:
        chosen = read_by[c.key]
        summary[c.key]["mib_per_obj"] = sum(chosen.values()) / len(chosen) / MIB
    return summary


def range_figures(r: Range, s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The RESULT keys of one range."""
    k = r.key
    out: dict[str, Any] = {}

    def per_mib(key: str) -> float:
        return float(s[key]["client_cpu_ms_per_obj"] / s[key]["mib_per_obj"])

    for key in s:
        out[f"samples_per_s_{key}_{k}"] = round(s[key]["samples_per_s"], 1)
    limit = s["aiohttp"]["samples_per_s"]
    low = min(s[d]["samples_per_s"] for d in DEFAULTS)
    out[f"default_fraction_of_limit_{k}"] = round(h.ratio(low, limit), 3)
    out[f"client_cpu_ms_per_mib_{k}"] = round(max(per_mib(d) for d in DEFAULTS), 3)
    out[f"limit_cpu_ms_per_mib_{k}"] = round(per_mib("aiohttp"), 3)
    out[f"mean_object_kib_{k}"] = round(s["map_default"]["mib_per_obj"] * 1024, 1)
    out[f"distinct_sizes_{k}"] = r.distinct
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    print(
        f"varied_sizes ({mode}): one epoch per run, every byte checked; DataLoader(num_workers="
        f"{dl.NUM_WORKERS}), batch {dl.BATCH_SIZE}; {args.repeats} run(s) per contender and "
        f"range, medians; bare loop with {dl.limit_concurrency()} in flight, at most "
        f"{LIMIT_OBJECTS:,} objects\n  ranges: "
        + ", ".join(f"{r.key} ({r.count:,} objects, {r.distinct:,} sizes)" for r in args.ranges)
    )
    result: dict[str, Any] = {}
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    server_share = 0.0
    left = 0
    with zg.Zygotes(per_run=(*zg.PER_RUN, *dl.FSSPEC_ENV)) as zygotes:
        for r in args.ranges:
            with h.emulator(latency="same-region") as emu:
                seed_range(emu, r)
                s = summaries[r.key] = run_range(emu, r, args, zygotes)
            result.update(range_figures(r, s))
            for v in s.values():
                server_share = max(server_share, h.ratio(v["server_cpu_s"], v["wall_s"]))
                left += int(v["composites_left"])
    result.update(
        server_cpu_fraction_max=round(server_share, 3),
        composites_left=left,
        repeats=args.repeats,
        mode=mode,
    )
    rows = [
        {
            "range": r.key,
            "contender": c.key,
            "samples_per_s": summaries[r.key][c.key]["samples_per_s"],
            "mb_per_s": summaries[r.key][c.key]["samples_per_s"]
            * summaries[r.key][c.key]["mib_per_obj"]
            * MIB
            / 1e6,
            "cpu_ms_per_mib": summaries[r.key][c.key]["client_cpu_ms_per_obj"]
            / summaries[r.key][c.key]["mib_per_obj"],
            "objects": summaries[r.key][c.key]["objects"],
        }
        for r in args.ranges
        for c in CONTENDERS
    ]
    h.print_table(
        "medians, constant latency (client CPU: all the contender's processes):",
        rows,
        [
            ("range", "range", ""),
            ("contender", "contender", ""),
            ("objects", "objects", ",.0f"),
            ("samples_per_s", "samples/s", ",.0f"),
            ("mb_per_s", "MB/s", ",.0f"),
            ("cpu_ms_per_mib", "client CPU ms/MiB", ".2f"),
        ],
    )
    for r in args.ranges:
        print(
            f"{r.key}: defaults at {result[f'default_fraction_of_limit_{r.key}']} of the bare "
            f"loop, {result[f'client_cpu_ms_per_mib_{r.key}']} ms client CPU per MiB "
            f"(loop {result[f'limit_cpu_ms_per_mib_{r.key}']})"
        )
    print(f"emulator CPU over wall time, highest run: {server_share:.2f}; composites left: {left}")
    png = h.bar_chart(
        NAME,
        [
            h.Panel(
                f"{r.key} ({r.distinct:,} sizes)",
                [c.key for c in CONTENDERS],
                [summaries[r.key][c.key]["samples_per_s"] for c in CONTENDERS],
                "samples/s",
            )
            for r in args.ranges
        ],
        suptitle=f"varied_sizes ({mode}): samples/s, medians",
    )
    path = h.write_json(
        NAME,
        {
            "result": result,
            "figure": h.rel(png),
            "rows": rows,
            "summary": summaries,
            "contenders": {c.key: c.label for c in CONTENDERS},
        },
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
