"""A latency tail's cost against the epoch's length (issue 19): small samples, epochs of growing size.

``dataloading.py``'s 10 KiB dataset is 6,000 objects with ``--quick`` (an
epoch of ~0.6 s on the 2-core VM) and 20,000 in a full run. Part of what a
tail costs an epoch it pays once, whatever the epoch's length: the first
batch waits for the slowest of the first requests, and the epoch's end for
its last groups and, when a compose stalled before it was applied, for that
compose's answer (until it answers, it may still make a composite, which the
epoch's end deletes). The rest it pays in proportion to the objects read.
``tail_slowdown_10kib`` mixes the two in the proportion of a 0.6 s epoch.

This benchmark tells them apart. It runs torchbucket's two small-object
paths, the iterable dataset and the map-style dataset with
``BucketBatchSampler`` (compose on, ``bytes`` samples: ``dataloading.py``'s
``tb_iter_compose`` and ``tb_map_fast_compose``, through the same contender
script, ``DataLoader(num_workers=2, batch_size=64)``, every byte checked),
each with its prefetch window's anchor (the default, see
``torchbucket/compose/_anchor.py``) and without (``anchor`` off in
``torchbucket/compose/_tuning.py``:
the epoch's end then waits for a compose held before it was applied), on
10 KiB datasets of growing size, under ``same-region`` and
``same-region-tail`` alternated repeat by repeat
(``_harness.alternating_runs``: every run starts a fresh sampler seeded by
its repeat, so the contenders meet the same draws and each repeat draws
anew). Per path and preset it fits the median epoch's seconds as
``fixed + count x per_object`` over the sizes.

``--quick``: 6,000, 20,000 and 60,000 objects, 3 repeats (~5 minutes); the
full run adds 120,000 and takes 5 repeats. ``--smoke``: 256 and 1,024
objects, one repeat (a code-path check).

Ends with ``RESULT {json}``: per path (``iterable``, ``map``,
``iterable_no_anchor``, ``map_no_anchor``),
``tail_slowdown_<path>_<count>`` (median samples/s under the constant preset
over under the tail, per dataset size), ``tail_fixed_cost_s_<path>`` (the
seconds the tail adds to an epoch of any length: the fits' difference at 0
objects), ``tail_steady_slowdown_<path>`` (the fits' per-object times, tail
over constant: what the tail costs an epoch long enough that its ends no
longer matter), ``first_batch_s_<path>_<preset>`` (medians over every run),
and ``server_cpu_fraction_max`` (the emulator's CPU seconds over an epoch's
wall time, the highest over the runs' medians: below 1, the server was not
the bottleneck), ``tail_runs_with_compose_stalled_before`` (runs under the
tail that met a compose stalled before it was applied, of ``tail_runs``; the
emulator counts its stalls per operation and side, and the output lists every
tail run with them: without anchors, such a run was held at its end), ``anchor_saves_s_<path>`` (the fixed cost without anchors less with
them). No goal of its own: issue 19's goal is ``dataloading.py``'s
``tail_slowdown_10kib``; this says what it is made of.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import dataloading as dl

NAME = "tail_epochs"
SIZE = 10 << 10
# Path -> (dataloading.py's contender, compose tuning): each path with its
# anchors (the default) and without, side by side.
PATHS = {
    "iterable": ("tb_iter_compose", {}),
    "map": ("tb_map_fast_compose", {}),
    "iterable_no_anchor": ("tb_iter_compose", {"anchor": False}),
    "map_no_anchor": ("tb_map_fast_compose", {"anchor": False}),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="6,000 to 60,000 objects, 3 repeats")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes (a code-path check)")
    p.add_argument("--repeats", type=int, default=None, help="runs per path, size and preset")
    p.add_argument("--counts", default=None, help="comma-separated dataset sizes (objects)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    h.add_latency_option(p)
    args = p.parse_args(argv)
    args.presets = h.latency_presets(p, args)
    if len(args.presets) != 2:
        p.error("--latency: two presets, the constant one first and the tail one second")
    if args.counts:
        args.counts = [int(x) for x in args.counts.split(",") if x]
    elif args.smoke:
        args.counts = [256, 1024]
    elif args.quick:
        args.counts = [6000, 20000, 60000]
    else:
        args.counts = [6000, 20000, 60000, 120000]
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 3 if args.quick else 5
    return args


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` over ``(x, y)`` points: ``(a, b)``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return my, float("nan")
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    base, tail = args.presets
    contenders = []
    for path, (key, fields) in PATHS.items():
        c = next(c for c in dl.CONTENDERS if c.key == key)
        spec = {**c.spec, "compose_tuning": fields}
        contenders.append(dataclasses.replace(c, key=path, spec=spec))
    sets = [dl.DataSet(f"10kib-{n}", n, SIZE, 0) for n in args.counts]
    print(
        f"tail_epochs ({mode}): one epoch, DataLoader(num_workers={dl.NUM_WORKERS}, "
        f"batch_size={dl.BATCH_SIZE}), {', '.join(d.label for d in sets)}; latency {base} and "
        f"{tail} alternated repeat by repeat, a fresh seeded sampler per run; "
        f"{args.repeats} run(s) per path, size and preset, medians; every byte checked."
    )
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    leftovers = 0
    with h.emulator(latency=base) as emu:
        for ds in sets:
            h.seed(emu, ds.bucket, count=ds.count, size=ds.size, prefix=dl.PREFIX)
            for rep, preset, c in h.alternating_runs(emu, args.presets, args.repeats, contenders):
                path = c.key
                print(f"  {preset} {ds.label} {path} run {rep + 1} ...", end="", file=sys.stderr)
                r = dl.run_one(emu, ds, c, rep, None, args.timeout)
                runs.setdefault((path, ds.count, preset), []).append(r)
                print(f" {r['samples_per_s']:,.0f} samples/s", file=sys.stderr, flush=True)
            leftovers += len(emu.object_names(ds.bucket, dl.COMPOSITES))

    med = {k: dl.summarize(v) for k, v in runs.items()}
    result: dict[str, Any] = {}
    rows = []
    server_share = 0.0
    for path in PATHS:
        fits = {}
        for preset in (base, tail):
            fits[preset] = fit([(n, med[(path, n, preset)]["wall_s"]) for n in args.counts])
            result[f"first_batch_s_{path}_{preset.replace('-', '_')}"] = round(
                h.median(
                    [r["first_batch_s"] for n in args.counts for r in runs[(path, n, preset)]]
                ),
                3,
            )
        for n in args.counts:
            b, t = med[(path, n, base)], med[(path, n, tail)]
            slowdown = h.ratio(b["samples_per_s"], t["samples_per_s"])
            result[f"tail_slowdown_{path}_{n}"] = round(slowdown, 3)
            shares = [s["server_cpu_s"] / s["wall_s"] for s in (b, t)]
            server_share = max(server_share, *shares)
            rows.append(
                {
                    "path": path,
                    "objects": n,
                    "base": b["samples_per_s"],
                    "tail": t["samples_per_s"],
                    "slowdown": slowdown,
                    "wall_base": b["wall_s"],
                    "wall_tail": t["wall_s"],
                    "first_base": b["first_batch_s"],
                    "first_tail": t["first_batch_s"],
                    "server": max(shares),
                    "left": sum(
                        r["composites_left"]
                        for preset in (base, tail)
                        for r in runs[(path, n, preset)]
                    ),
                }
            )
        (a0, b0), (a1, b1) = fits[base], fits[tail]
        result[f"tail_fixed_cost_s_{path}"] = round(a1 - a0, 3)
        result[f"tail_steady_slowdown_{path}"] = round(h.ratio(b1, b0), 3)
        result[f"fit_{path}"] = {
            preset: {"fixed_s": round(a, 4), "us_per_object": round(b * 1e6, 2)}
            for preset, (a, b) in fits.items()
        }
    h.print_table(
        "10 KiB, by dataset size (medians):",
        rows,
        [
            ("path", "path", "s"),
            ("objects", "objects", ",d"),
            ("base", f"samples/s {base}", ",.0f"),
            ("tail", f"samples/s {tail}", ",.0f"),
            ("slowdown", "tail slowdown", ".3f"),
            ("wall_base", "epoch s", ".2f"),
            ("wall_tail", "epoch s, tail", ".2f"),
            ("first_base", "1st batch s", ".3f"),
            ("first_tail", "1st batch s, tail", ".3f"),
            ("server", "server CPU / wall", ".2f"),
            ("left", "composites left", "d"),
        ],
    )
    # Each run under the tail with the stalls it met: a compose stalled before
    # it was applied holds the epoch's end until it answers (its group was
    # read around, but until it answers it may still make a composite).
    tail_rows = [
        {
            "path": p,
            "objects": n,
            "run": i + 1,
            "rate": r["samples_per_s"],
            "wall": r["wall_s"],
            "compose_before": r["stalls"].get("compose:before", 0),
            "compose_after": r["stalls"].get("compose:after", 0),
            "other": sum(v for k, v in r["stalls"].items() if not k.startswith("compose:")),
        }
        for (p, n, preset), rs in runs.items()
        if preset == tail
        for i, r in enumerate(rs)
    ]
    result["tail_runs"] = len(tail_rows)
    result["tail_runs_with_compose_stalled_before"] = sum(
        1 for r in tail_rows if r["compose_before"]
    )
    h.print_table(
        f"Every run under {tail}, with the stalls it met:",
        tail_rows,
        [
            ("path", "path", "s"),
            ("objects", "objects", ",d"),
            ("run", "run", "d"),
            ("rate", "samples/s", ",.0f"),
            ("wall", "epoch s", ".2f"),
            ("compose_before", "composes stalled before applied", "d"),
            ("compose_after", "composes stalled after", "d"),
            ("other", "other stalls (GET, DELETE...)", "d"),
        ],
    )
    for path in ("iterable", "map"):
        # What the anchors save an epoch under the tail: the fitted fixed costs' difference.
        result[f"anchor_saves_s_{path}"] = round(
            result[f"tail_fixed_cost_s_{path}_no_anchor"] - result[f"tail_fixed_cost_s_{path}"], 3
        )
    for path in PATHS:
        f = result[f"fit_{path}"]
        print(
            f"{path}: epoch seconds = fixed + objects x per-object time; {base} "
            f"{f[base]['fixed_s']:.3f} s + {f[base]['us_per_object']:.1f} us, {tail} "
            f"{f[tail]['fixed_s']:.3f} s + {f[tail]['us_per_object']:.1f} us: the tail adds "
            f"{result[f'tail_fixed_cost_s_{path}']:.3f} s per epoch and slows the rest "
            f"{result[f'tail_steady_slowdown_{path}']:.3f}x"
        )
    result.update(
        mode=mode,
        repeats=args.repeats,
        counts=args.counts,
        object_size=SIZE,
        latency_presets=args.presets,
        server_cpu_fraction_max=round(server_share, 3),
        composites_left=sum(r["left"] for r in rows),
        composites_left_in_buckets=leftovers,
    )
    labels = [f"{r['path']} {r['objects']:,}" for r in rows]
    png = h.bar_chart(
        NAME,
        [
            h.Panel(
                "Tail slowdown by dataset size",
                labels,
                [r["slowdown"] for r in rows],
                f"samples/s {base} / {tail}",
                goal=1.15,
                goal_label="issue 19's goal",
            ),
            h.Panel(
                "Epoch seconds under the tail",
                labels,
                [r["wall_tail"] for r in rows],
                "s",
            ),
        ],
        suptitle=f"10 KiB objects, DataLoader(num_workers={dl.NUM_WORKERS}), {mode}",
    )
    path = h.write_json(
        NAME,
        {
            "result": result,
            "figure": h.rel(png),
            "rows": rows,
            "runs": {f"{p}/{n}/{preset}": v for (p, n, preset), v in runs.items()},
        },
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
