"""Size sweep (issue 43): one epoch at every sample size from 512 B to 64 MiB, side by side.

Against the emulator's model store (a fresh one per size), one epoch through
``DataLoader(num_workers=2)`` of each contender, every byte of every sample
checked in the consumer, at nine log-spaced sizes: 512 B, 4, 16, 64 and 256
KiB, 1, 4, 16 and 64 MiB. A batch is 64 samples, or as many as make 64 MiB
where they are larger than 1 MiB (16 of 4 MiB, 4 of 16 MiB, 1 of 64 MiB).
Contenders (``benchmarks/dataloading.py``'s scripts):

- ``map_default``: ``BucketMapDataset.from_prefix(uri)`` with a shuffling
  ``BucketBatchSampler``, every config left at the library's default (what a
  user who follows the README gets), samples as the ``bytes`` it hands out,
  batched by the DataLoader's own ``collate_fn`` (every other contender
  keeps a batch as the list of its samples: the same list for ``bytes``);
- ``iter_default``: ``BucketIterableDataset.from_prefix(uri)``, the same;
- ``map_plain``: ``BucketMapDataset.from_prefix(uri)`` in a plain
  ``DataLoader(ds, batch_size=..., shuffle=True, num_workers=2)``: no
  sampler of torchbucket's (the dataset reads ahead in the order torch's
  ``RandomSampler`` is about to yield, ``datasets/_observed.py``);
- ``tb_best``: torchbucket's best explicit configuration for the size
  (:func:`best_spec`: the iterable dataset; compose where the library does;
  ``FetchConfig(output="tensor", reuse_shared_memory=True)`` from 64 KiB);
- ``df_best``: ``gcs-torch-dataflux`` 1.4.0 map-style, compose on, 8
  threads per worker (its best in dataloading.py's runs), in ``.venv-bench``;
- ``gcsfs_cat``: a map-style ``Dataset`` on gcsfs whose ``__getitems__``
  calls ``fs.cat(paths)``, ``DataLoader(shuffle=True)``, in ``.venv-gcsfs``
  (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``);
- ``aiohttp``: a bare aiohttp loop in one process with as many requests in
  flight as torchbucket's iterable dataset (workers x ``FetchConfig.reads_in_flight``):
  the limit. It reads in one process and hands nothing over: no DataLoader,
  no worker, no pipe, which every other contender has;
- ``aiohttp_dl``: the same bare loop inside the same ``DataLoader`` (2
  workers, ``aiohttp_dataloader.py``'s prototype: an event loop per worker,
  as many requests in flight), its ``bytes`` samples handed to the main
  process through the pipe: what that architecture allows with no library
  around it. Reported beside the limit (``default_fraction_of_dataloader_loop_*``),
  never instead of it: the goals stay against ``aiohttp``.

Opt-in by ``--only`` (an A/B in one run): ``map_default_pipe`` and
``iter_default_pipe``, the defaults with ``FetchConfig(shared_bytes=False)``
(raw ``bytes`` samples pickled through the pipe, as before
``datasets/_handover.py``); ``<map|iter>_shared_over_pipe_<size>`` in the RESULT.
``map_split`` and ``map_random_split``: 90% of the objects in a plain
``DataLoader(shuffle=True)``, a part of ``ds.split`` against ``random_split``'s
torch ``Subset`` (``split_over_random_split_<size>``). ``map_seedable``: the
map-style dataset with Accelerate's ``SeedableRandomSampler``.

Latency (``--latency``): ``same-region`` (constant) and ``same-region-tail``;
under the tail only the two defaults run (the tail goal is theirs), each
default's two runs of a repeat back to back, the presets' order and the
contenders' reversed every other repeat. ``--quick``: the counts below (an
epoch of 2-4 s of the defaults at every size, where the DataLoader's start,
about 0.25 s to the first batch, would otherwise weigh on the figure more
than in any real epoch; dataflux and gcsfs, 3-25 times slower below 256
KiB, read the first :data:`PEER_OBJECTS` of them there, and so do
``aiohttp_dl`` and the bare loop, 1.7-5 times slower), 3 runs of the
defaults per preset, 2 of the bare loop and of ``map_plain`` (constant preset only), 1 of the others (``tb_best``,
``aiohttp_dl``, dataflux, gcsfs); the full run doubles the counts and runs
the defaults 5 times, everything else 3. Every contender but the
bare loop is forked from an interpreter of its environment that has
imported torch once (``_zygote.py``: the same measured phase, 2-3 s less
per run); ``--fresh-processes`` starts each in a fresh one. ``--smoke``:
three sizes, tiny counts, one run. ``--sizes`` picks sizes (``512b,1mib``...),
``--only`` contenders; a run with either leaves ``docs/img/sizes.png`` alone.
``--decode``: the sweep with a JPEG decode in ``data_format_fn`` instead
(``_sizes_decode.py``: four sizes in ``--quick``, its own RESULT keys).

Ends with ``RESULT {json}``, per size key (``512b`` ... ``64mib``):
``default_fraction_of_limit_<size>`` (the lower of the two defaults' samples/s
over the bare loop's; ``map_`` / ``iter_default_fraction_of_limit_<size>``
each), ``default_speedup_vs_dataflux_<size>`` and ``_vs_gcsfs_<size>`` (the
lower default over ``df_best`` / ``gcsfs_cat``), ``client_cpu_ms_per_mib_<size>``
(the higher of the two defaults' client CPU, all processes, per MiB read),
``plain_fraction_of_limit_<size>``, ``plain_speedup_vs_dataflux_<size>`` and
``_vs_gcsfs_<size>`` (``map_plain``'s, in the same three goals),
``plain_over_default_<size>`` (``map_plain`` over ``map_default``),
``best_fraction_of_limit_<size>``, ``default_fraction_of_dataloader_loop_<size>``
(the lower default over ``aiohttp_dl``) and ``dataloader_loop_fraction_of_limit_<size>``
(``aiohttp_dl`` over the limit), ``tail_slowdown_map_<size>`` and
``_iterable_<size>`` (the median samples/s under the constant preset over
the median under the tail), ``tail_pairs_<map|iterable>_<size>`` (each
repeat's constant run over its tail run, the two back to back, sorted: the
spread behind that ratio), and ``samples_per_s_<key>_<size>``.
Goals (constant preset): defaults (both, and ``map_plain``) >= 0.8 of the
bare loop, >= 3x dataflux's best and >= 2x gcsfs's batched cat at every size; under the tail every
size's slowdown <= 1.15 for both defaults; client CPU <= 2 ms per MiB from
1 MiB. ``goals_failing`` names the sizes where each goal failed. The figure
(samples/s and MB/s against size, log-log, one line per contender) is
written to ``bench-output/sizes.png`` and, outside ``--smoke``, copied to
``docs/img/sizes.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import _zygote as zg
import dataloading as dl

NAME = "sizes"
MIB = 1 << 20
KIB = 1 << 10
#: (key, bytes, objects in --quick). Log-spaced, 1 MiB included.
SIZES = [
    ("512b", 512, 48000),
    ("4kib", 4 * KIB, 40000),
    ("16kib", 16 * KIB, 32000),
    ("64kib", 64 * KIB, 18000),
    ("256kib", 256 * KIB, 6000),
    ("1mib", MIB, 2000),
    ("4mib", 4 * MIB, 512),
    ("16mib", 16 * MIB, 128),
    ("64mib", 64 * MIB, 32),
]
SMOKE = [("512b", 512, 512), ("64kib", 64 * KIB, 256), ("4mib", 4 * MIB, 16)]
#: A batch holds at most this many bytes (and at most 64 samples).
BATCH_BYTES = 64 * MIB
DEFAULTS = ("map_default", "iter_default")
#: dataflux, gcsfs, the bare loop and the same loop in DataLoader workers
#: (``aiohttp_dl``, a reference) read at most the first this many objects of
#: a size (a power of ten: dataflux lists them by prefix): 2-11 s at their
#: rates below 256 KiB, where the defaults need 18,000-48,000 for an epoch of
#: 2-4 s. The bare loop read all of them before, 11-14 s a run at 512 B and 4
#: KiB (its epoch, unlike the others', then carried its start less).
PEER_OBJECTS = 10_000
PEERS = ("df_best", "gcsfs_cat")
CAPPED = (*PEERS, "aiohttp", "aiohttp_dl")
#: Under the tail only the defaults run: the goal is theirs, and the bare
#: loop's two runs there (for reference) cost as much time as a third run of
#: both defaults under both presets, which a ratio of medians needs more (one
#: run against the run next to it moves 0.74-1.54 on this VM, docs/benchmarks.md).
TAIL_KEYS = DEFAULTS

CONTENDERS = [
    dl.Contender("map_default", "torchbucket map + BucketBatchSampler, defaults", "tb_loader.py",
                 False, "default", {"kind": "map_fast", "collate": "torch"}),
    dl.Contender("iter_default", "torchbucket iterable, defaults", "tb_loader.py", False,
                 "default", {"kind": "iterable", "collate": "torch"}),
    dl.Contender("map_plain", "torchbucket map, plain DataLoader(shuffle=True), defaults",
                 "tb_loader.py", False, "default", {"kind": "map", "collate": "torch",
                                                    "loader_shuffle": True}),
    dl.Contender("tb_best", "torchbucket, best explicit config", "tb_loader.py", False,
                 "torchbucket", {}),
    dl.Contender("df_best", "dataflux map, compose, 8 threads", "dataflux_loader.py", True,
                 "dataflux", {"kind": "map", "compose": True, "threads": 8}),
    dl.Contender("gcsfs_cat", "gcsfs, batched fs.cat", "gcsfs_cat_loader.py", True, "gcsfs", {}),
    dl.Contender("aiohttp", "bare aiohttp loop (limit)", "aiohttp_loop.py", False, "limit", {}),
    dl.Contender("aiohttp_dl", "bare aiohttp loop in DataLoader workers, bytes via pipe",
                 "aiohttp_dataloader.py", False, "reference", {}),
]  # fmt: skip
#: Opt-in (``--only``): the defaults with the raw-bytes hand-over through shared
#: memory turned off (``FetchConfig(shared_bytes=False)``), for an A/B in one run.
AB_CONTENDERS = [
    dl.Contender("map_default_pipe", "torchbucket map + BucketBatchSampler, defaults, bytes via pipe",
                 "tb_loader.py", False, "default", {"kind": "map_fast", "collate": "torch",
                                                    "fetch_config": {"shared_bytes": False}}),
    dl.Contender("iter_default_pipe", "torchbucket iterable, defaults, bytes via pipe",
                 "tb_loader.py", False, "default", {"kind": "iterable", "collate": "torch",
                                                    "fetch_config": {"shared_bytes": False}}),
    # 90% of the objects in a plain DataLoader(shuffle=True): a part of
    # ds.split (a dataset of its own) against random_split's torch Subset.
    dl.Contender("map_split", "torchbucket map, ds.split's 90% part, plain DataLoader(shuffle=True)",
                 "tb_loader.py", False, "default", {"kind": "map", "collate": "torch",
                                                    "loader_shuffle": True, "part": "split"}),
    dl.Contender("map_random_split", "torchbucket map, random_split's 90% Subset, plain "
                 "DataLoader(shuffle=True)", "tb_loader.py", False, "default",
                 {"kind": "map", "collate": "torch", "loader_shuffle": True, "part": "random_split"}),
    # Hugging Face Accelerate's SeedableRandomSampler (the Trainer's default) in a plain DataLoader.
    dl.Contender("map_seedable", "torchbucket map, Accelerate's SeedableRandomSampler",
                 "tb_loader.py", False, "default", {"kind": "map", "collate": "torch",
                                                    "sampler": "seedable"}),
]  # fmt: skip
STYLE = {  # figure: colour, line style
    "map_default": ("#d9822b", "-"),
    "iter_default": ("#a8501b", "-"),
    "map_plain": ("#e8b04a", "--"),
    "tb_best": ("#d9822b", ":"),
    "df_best": ("#4878a8", "-"),
    "gcsfs_cat": ("#6a9a4b", "-"),
    "aiohttp": ("#555555", "--"),
    "aiohttp_dl": ("#555555", ":"),
    "map_default_pipe": ("#d9822b", "-."),
    "iter_default_pipe": ("#a8501b", "-."),
    "map_split": ("#e8b04a", "-."),
    "map_random_split": ("#999999", "-."),
    "map_seedable": ("#e8b04a", ":"),
}


def best_spec(size: int) -> dict[str, Any]:
    """torchbucket's best explicit configuration at ``size`` (dataloading.py's best contenders).

    The iterable dataset; compose where the library composes by default
    (``datasets._units.COMPOSE_BELOW``: groups of up to 31 objects within the
    4 MiB cap); tensor output in reused shared memory from 64 KiB (below,
    ``bytes`` cost less CPU than a view of a segment each).
    """
    from torchbucket.datasets._units import COMPOSE_BELOW  # the library's own cut

    spec: dict[str, Any] = {"kind": "iterable", "compose": size < COMPOSE_BELOW}
    if size >= 64 * KIB:
        spec.update(output="tensor", reuse_shm=True)
    return spec


def label(size: int) -> str:
    if size >= MIB:
        return f"{size // MIB} MiB"
    if size >= KIB:
        return f"{size // KIB} KiB"
    return f"{size} B"


def batch_size(size: int) -> int:
    return max(1, min(dl.BATCH_SIZE, BATCH_BYTES // size))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="nine sizes, 3 runs a preset")
    mode.add_argument("--smoke", action="store_true", help="three tiny sizes (a code-path check)")
    p.add_argument("--repeats", type=int, default=None, help="runs of the defaults per preset")
    p.add_argument("--limit-repeats", type=int, default=None, help="runs of the bare loop")
    p.add_argument("--slow-repeats", type=int, default=None, help="runs of the other contenders")
    p.add_argument("--only", default=None, help="comma-separated contender keys (default all)")
    p.add_argument("--sizes", default=None, help="comma-separated size keys (default all)")
    p.add_argument("--scale", type=float, default=None, help="multiply the object counts")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per contender run")
    p.add_argument(
        "--decode",
        action="store_true",
        help="the decode sweep instead (JPEGs decoded in data_format_fn; _sizes_decode.py)",
    )
    p.add_argument(
        "--fresh-processes",
        action="store_true",
        help="start every contender in a fresh interpreter, none forked from a zygote "
        "(_zygote.py; the figures are the same, the sweep slower)",
    )
    h.add_latency_option(p)
    args = p.parse_args(argv)
    args.presets = h.latency_presets(p, args)
    full = not (args.quick or args.smoke)
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 5 if full else 3
    if args.limit_repeats is None:
        args.limit_repeats = 1 if args.smoke else 3 if full else 2
    if args.slow_repeats is None:
        args.slow_repeats = 3 if full else 1
    if args.scale is None:
        args.scale = 2.0 if full else 1.0
    return args


def datasets_for(args: argparse.Namespace) -> list[dl.DataSet]:
    table = SMOKE if args.smoke else SIZES
    sets = [dl.DataSet(k, max(2, round(n * args.scale)), size, 0) for k, size, n in table]
    if args.sizes:
        sets = [d for d in sets if d.key in args.sizes.split(",")]
    return sets


def peer_prefix() -> str:
    """The prefix of the first :data:`PEER_OBJECTS` seeded names (8-digit indices)."""
    digits = len(str(PEER_OBJECTS)) - 1
    assert 10**digits == PEER_OBJECTS, "PEER_OBJECTS must be a power of ten"
    return dl.PREFIX + "0" * (8 - digits)


def contenders_for(ds: dl.DataSet, selected: list[dl.Contender]) -> list[dl.Contender]:
    """The contenders at ``ds``'s size: its batch size, ``tb_best``'s config."""
    out = []
    for c in selected:
        spec = {**c.spec, "batch_size": batch_size(ds.size)}
        if c.key == "tb_best":
            spec.update(best_spec(ds.size))
        if c.key in CAPPED and ds.count > PEER_OBJECTS:
            spec.update(count=PEER_OBJECTS, list_prefix=peer_prefix())
        out.append(dataclasses.replace(c, spec=spec))
    return out


def repeats_of(key: str, args: argparse.Namespace) -> int:
    """Runs of a contender per preset it runs under: the goals' more often."""
    if key in DEFAULTS:
        return int(args.repeats)
    return int(args.limit_repeats if key in ("aiohttp", "map_plain") else args.slow_repeats)


def sweep_one(
    ds: dl.DataSet,
    contenders: list[dl.Contender],
    args: argparse.Namespace,
    bench_py: str | None,
    zygotes: zg.Zygotes | None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every run at one size, a default's presets back to back; preset -> contender -> medians."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {} for p in args.presets}
    rates: dict[str, dict[str, dict[int, float]]] = {p: {} for p in args.presets}
    with h.emulator(latency=args.presets[0]) as emu:
        h.seed(emu, ds.bucket, count=ds.count, size=ds.size, prefix=dl.PREFIX)
        for rep in range(max(args.repeats, args.limit_repeats, args.slow_repeats)):
            # The orders reversed every other repeat: a run's place after
            # another moved its rate (64 MiB: the iterable default, always
            # after the map-style one, slowed 1.13-1.27x under the tail in
            # four sweeps, and 1.05x run alone). A default's runs under the
            # two presets come back to back: the VM's speed drifts within
            # seconds (docs/benchmarks.md), and the tail figure is their ratio.
            for c in contenders if rep % 2 == 0 else list(reversed(contenders)):
                if rep >= repeats_of(c.key, args):
                    continue
                for preset in args.presets if rep % 2 == 0 else list(reversed(args.presets)):
                    if preset != args.presets[0] and c.key not in TAIL_KEYS:
                        continue
                    model = h.reseeded(preset, rep)
                    emu.set_latency(model)
                    print(
                        f"  {preset} {ds.key} {c.key} run {rep + 1} ...",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
                    try:
                        r = dl.run_one(emu, ds, c, rep, bench_py, args.timeout, zygotes=zygotes)
                    except h.ContenderError as exc:  # reported, the sweep goes on
                        print(f" failed: {str(exc)[:300]}", file=sys.stderr, flush=True)
                        continue
                    runs[preset].setdefault(c.key, []).append(r)
                    rates[preset].setdefault(c.key, {})[rep] = r["samples_per_s"]
                    print(f" {r['samples_per_s']:,.1f} samples/s", file=sys.stderr, flush=True)
    out = {p: {k: dl.summarize(v) for k, v in by.items()} for p, by in runs.items()}
    for p, by_key in rates.items():
        for k, per_rep in by_key.items():  # each run's rate by its repeat, for the pairs
            out[p][k]["runs_samples_per_s"] = {rep: round(x, 1) for rep, x in per_rep.items()}
    return out


def rate(summary: dict[str, dict[str, Any]], key: str) -> float:
    return float((summary.get(key) or {}).get("samples_per_s", math.nan))


def size_figures(
    ds: dl.DataSet, by_preset: dict[str, dict[str, dict[str, Any]]], presets: list[str]
) -> dict[str, Any]:
    """The RESULT keys of one size."""
    k = ds.key
    s = by_preset[presets[0]]
    out: dict[str, Any] = {}
    for c in CONTENDERS + AB_CONTENDERS:
        r = rate(s, c.key)
        if not math.isnan(r):
            out[f"samples_per_s_{c.key}_{k}"] = round(r, 1)
    limit, df, gcsfs = rate(s, "aiohttp"), rate(s, "df_best"), rate(s, "gcsfs_cat")
    defaults = [rate(s, key) for key in DEFAULTS]
    low = min(defaults) if not any(math.isnan(x) for x in defaults) else math.nan
    for key, r in zip(("map", "iter"), defaults, strict=True):
        out[f"{key}_default_fraction_of_limit_{k}"] = round(h.ratio(r, limit), 3)
    out[f"default_fraction_of_limit_{k}"] = round(h.ratio(low, limit), 3)
    out[f"best_fraction_of_limit_{k}"] = round(h.ratio(rate(s, "tb_best"), limit), 3)
    # Beside the limit, not instead of it: the same bare loop inside DataLoader
    # workers, its bytes handed to the main process through the pipe, as
    # torchbucket's must be; and the A/B of the hand-over when it ran.
    out[f"default_fraction_of_dataloader_loop_{k}"] = round(h.ratio(low, rate(s, "aiohttp_dl")), 3)
    out[f"dataloader_loop_fraction_of_limit_{k}"] = round(h.ratio(rate(s, "aiohttp_dl"), limit), 3)
    for key in ("map", "iter"):
        pipe = rate(s, f"{key}_default_pipe")
        if not math.isnan(pipe):
            out[f"{key}_shared_over_pipe_{k}"] = round(h.ratio(rate(s, f"{key}_default"), pipe), 3)
    split = rate(s, "map_split")
    if not math.isnan(split):
        out[f"split_over_random_split_{k}"] = round(h.ratio(split, rate(s, "map_random_split")), 3)
    out[f"default_speedup_vs_dataflux_{k}"] = round(h.ratio(low, df), 2)
    out[f"default_speedup_vs_gcsfs_{k}"] = round(h.ratio(low, gcsfs), 2)
    # A plain DataLoader(shuffle=True) over the map-style dataset: what a user
    # who passes no sampler of ours gets.
    plain = rate(s, "map_plain")
    if not math.isnan(plain):
        out[f"plain_fraction_of_limit_{k}"] = round(h.ratio(plain, limit), 3)
        out[f"plain_speedup_vs_dataflux_{k}"] = round(h.ratio(plain, df), 2)
        out[f"plain_speedup_vs_gcsfs_{k}"] = round(h.ratio(plain, gcsfs), 2)
        out[f"plain_over_default_{k}"] = round(h.ratio(plain, rate(s, "map_default")), 3)
    cpu = [float((s.get(key) or {}).get("client_cpu_ms_per_obj", math.nan)) for key in DEFAULTS]
    cpu_hi = max(cpu) if not any(math.isnan(x) for x in cpu) else math.nan
    out[f"client_cpu_ms_per_mib_{k}"] = round(cpu_hi / (ds.size / MIB), 3)
    # The emulator's own CPU over the epoch's wall, the highest of the contenders:
    # below 1, the server was not what held them.
    out[f"server_cpu_fraction_{k}"] = round(
        max((v["server_cpu_s"] / v["wall_s"] for v in s.values() if v), default=math.nan), 3
    )
    limit_cpu = float((s.get("aiohttp") or {}).get("client_cpu_ms_per_obj", math.nan))
    out[f"limit_cpu_ms_per_mib_{k}"] = round(limit_cpu / (ds.size / MIB), 3)
    if len(presets) > 1:
        t = by_preset[presets[-1]]
        for key, name in (("map_default", "map"), ("iter_default", "iterable")):
            out[f"tail_slowdown_{name}_{k}"] = round(h.ratio(rate(s, key), rate(t, key)), 3)
            # Each repeat's two runs back to back, constant over tail: the spread.
            c_runs = (s.get(key) or {}).get("runs_samples_per_s", {})
            t_runs = (t.get(key) or {}).get("runs_samples_per_s", {})
            out[f"tail_pairs_{name}_{k}"] = sorted(
                round(c_runs[rep] / t_runs[rep], 3) for rep in c_runs if t_runs.get(rep)
            )
    return out


def goals(result: dict[str, Any], sets: list[dl.DataSet], tail: bool) -> None:
    """Add ``goals`` (each true when it holds at every size) and ``goals_failing`` (the sizes)."""
    checks: dict[str, list[tuple[str, str, float]]] = {
        "default_fraction_of_limit_ge_0_8": [
            ("default_fraction_of_limit", ">=", 0.8),
            ("plain_fraction_of_limit", ">=", 0.8),
        ],
        "default_speedup_vs_dataflux_ge_3": [
            ("default_speedup_vs_dataflux", ">=", 3),
            ("plain_speedup_vs_dataflux", ">=", 3),
        ],
        "default_speedup_vs_gcsfs_ge_2": [
            ("default_speedup_vs_gcsfs", ">=", 2),
            ("plain_speedup_vs_gcsfs", ">=", 2),
        ],
        "client_cpu_le_2_ms_per_mib_from_1mib": [("client_cpu_ms_per_mib", "<=", 2)],
    }
    if tail:
        checks["tail_slowdown_le_1_15"] = [
            ("tail_slowdown_map", "<=", 1.15),
            ("tail_slowdown_iterable", "<=", 1.15),
        ]
    result["goals"], result["goals_failing"] = {}, {}
    for goal, tests in checks.items():
        failing = []
        for d in sets:
            if goal.startswith("client_cpu") and d.size < MIB:
                continue
            for key, op, bound in tests:
                v = result.get(f"{key}_{d.key}")
                if v is None and key.startswith("plain_"):
                    continue  # map_plain left out (--only)
                ok = (
                    v is not None
                    and not math.isnan(v)
                    and (v >= bound if op == ">=" else v <= bound)
                )
                if not ok and d.key not in failing:
                    failing.append(d.key)
        result["goals"][goal] = not failing
        result["goals_failing"][goal] = failing


def print_tables(sets: list[dl.DataSet], by_size: dict[str, Any], presets: list[str]) -> None:
    for preset in presets:
        rows = []
        for d in sets:
            s = by_size[d.key][preset]
            for c in CONTENDERS + AB_CONTENDERS:
                if s.get(c.key):
                    v = s[c.key]
                    rows.append(
                        {
                            "size": f"{label(d.size)} x {d.count:,}",
                            "contender": c.key,
                            "mb_s": v["samples_per_s"] * d.size / 1e6,
                            "cpu_ms_mib": v["client_cpu_ms_per_obj"] / (d.size / MIB),
                            **v,
                        }
                    )
        h.print_table(
            f"{preset} (medians; runs in the last column):",
            rows,
            [
                ("size", "size", "s"),
                ("contender", "contender", "s"),
                ("samples_per_s", "samples/s", ",.1f"),
                ("mb_s", "MB/s", ",.0f"),
                ("first_batch_s", "1st batch s", ".2f"),
                ("client_cpu_ms_per_obj", "CPU ms/obj", ".3f"),
                ("cpu_ms_mib", "CPU ms/MiB", ".2f"),
                ("requests_per_obj", "req/obj", ".2f"),
                ("peak_rss_worker_mb", "RSS/worker MiB", ".0f"),
                ("server_cpu_s", "server CPU s", ".2f"),
                ("repeats", "runs", "d"),
            ],
        )


def figure(sets: list[dl.DataSet], by_size: dict[str, Any], preset: str) -> Path:
    """Samples/s and MB/s against size, log-log, one line per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for c in CONTENDERS:
        pts = [(d.size, rate(by_size[d.key][preset], c.key)) for d in sets]
        pts = [(x, y) for x, y in pts if not math.isnan(y)]
        if not pts:
            continue
        colour, style = STYLE[c.key]
        xs = [x for x, _ in pts]
        axes[0].plot(xs, [y for _, y in pts], style, color=colour, marker="o", label=c.label)
        axes[1].plot(xs, [x * y / 1e6 for x, y in pts], style, color=colour, marker="o")
    for ax, ylabel in zip(axes, ("samples/s", "MB/s"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([d.size for d in sets], [label(d.size) for d in sets], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("sample size")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"One epoch, DataLoader(num_workers=2), {preset} latency model, every byte checked",
        fontsize=11,
    )
    fig.tight_layout()
    h.OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    path = h.OUTPUT_DIR / f"{NAME}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main_decode(args: argparse.Namespace, mode: str) -> int:
    """``--decode``: the sweep with a JPEG decode in ``data_format_fn`` (``_sizes_decode``)."""
    import _sizes_decode

    t0 = time.monotonic()
    print(
        f"sizes --decode ({mode}): one epoch of JPEGs decoded in data_format_fn, "
        f"DataLoader(num_workers={dl.NUM_WORKERS}), same-region latency, {args.repeats} run(s)"
    )
    result = _sizes_decode.run(args, h.bench_python())
    result.update(mode=mode, repeats=args.repeats, elapsed_s=round(time.monotonic() - t0))
    result.update(cpu_model=h.machine_info()["cpu_model"])
    path = h.write_json(f"{NAME}_decode", {"result": result})
    print(f"wrote {h.rel(path)}")
    h.emit_result(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    bench_py = h.bench_python()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.decode:
        return main_decode(args, mode)
    selected = [
        c
        for c in CONTENDERS + (AB_CONTENDERS if args.only else [])
        if not args.only or c.key in args.only.split(",")
    ]
    if bench_py is None:
        print("dataflux skipped: run benchmarks/setup_bench_env.sh")
        selected = [c for c in selected if c.family != "dataflux"]
    if h.fsspec_python() is None:
        print("gcsfs skipped: no .venv-gcsfs (run benchmarks/setup_bench_env.sh)")
        selected = [c for c in selected if c.family != "gcsfs"]
    sets = datasets_for(args)
    print(
        f"sizes ({mode}): one epoch, DataLoader(num_workers={dl.NUM_WORKERS}, batch_size=64 or "
        f"{BATCH_BYTES // MIB} MiB), latency {' and '.join(args.presets)} (the tail runs "
        f"{', '.join(TAIL_KEYS)} only, each one's two runs of a repeat back to back; the "
        f"orders reversed every other repeat), every byte checked; {args.repeats} run(s) of the "
        f"defaults per preset, {args.limit_repeats} of the bare loop, {args.slow_repeats} of "
        f"the others, medians; bare loop with {dl.limit_concurrency()} in flight\n"
        f"  sizes: {', '.join(f'{label(d.size)} x {d.count:,}' for d in sets)}"
    )
    by_size: dict[str, Any] = {}
    result: dict[str, Any] = {}
    # Contenders forked from interpreters that have imported torch once (all
    # but the bare loop, which needs none): the same measured phases, 2-3 s
    # less per run. gcsfs reads its variables at its own import, in the child.
    per_run = (*zg.PER_RUN, *dl.FSSPEC_ENV)
    zygotes = None if args.fresh_processes else zg.Zygotes(per_run=per_run)
    with zygotes or contextlib.nullcontext():
        for ds in sets:
            by_size[ds.key] = sweep_one(ds, contenders_for(ds, selected), args, bench_py, zygotes)
            result.update(size_figures(ds, by_size[ds.key], args.presets))
    goals(result, sets, tail=len(args.presets) > 1)
    print_tables(sets, by_size, args.presets)
    for d in sets:
        k = d.key
        print(
            f"{label(d.size)}: defaults at {result[f'default_fraction_of_limit_{k}']} of the "
            f"bare loop (map {result[f'map_default_fraction_of_limit_{k}']}, iterable "
            f"{result[f'iter_default_fraction_of_limit_{k}']}), "
            f"{result[f'default_speedup_vs_dataflux_{k}']}x dataflux, "
            f"{result[f'default_speedup_vs_gcsfs_{k}']}x gcsfs, "
            f"{result[f'client_cpu_ms_per_mib_{k}']} ms CPU/MiB; tail slowdown map "
            f"{result.get(f'tail_slowdown_map_{k}')}, iterable "
            f"{result.get(f'tail_slowdown_iterable_{k}')}; plain DataLoader "
            f"{result.get(f'plain_fraction_of_limit_{k}')} of the loop, "
            f"{result.get(f'plain_over_default_{k}')} of map_default"
        )
    png = figure(sets, by_size, args.presets[0])
    docs_img = h.ROOT / "docs" / "img"
    # A partial run leaves the docs' figure; so does a run from a tree without docs.
    if not (args.smoke or args.sizes or args.only) and docs_img.is_dir():
        shutil.copyfile(png, docs_img / f"{NAME}.png")
    result.update(
        mode=mode,
        repeats=args.repeats,
        repeats_limit=args.limit_repeats,
        repeats_dataflux_and_gcsfs=args.slow_repeats,
        sizes={
            d.key: {"count": d.count, "size": d.size, "batch_size": batch_size(d.size)}
            for d in sets
        },
        best_config={d.key: best_spec(d.size) for d in sets},
        limit_concurrency=dl.limit_concurrency(),
        latency_presets=args.presets,
        cpu_model=h.machine_info()["cpu_model"],
        elapsed_s=round(time.monotonic() - t0),
        bytes_verified=True,
    )
    path = h.write_json(
        NAME,
        {
            "result": result,
            "summary": by_size,
            "figure": h.rel(png),
            "contenders": {c.key: c.label for c in CONTENDERS},
        },
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
