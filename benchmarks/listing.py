"""Benchmark: listing a prefix, torchbucket against dataflux and a sequential list.

Against the emulator's model store behind the same-region latency model (a
list page costs about 60 ms and holds at most 1,000 entries), side by side in
one run, each contender in its own process:

- ``torchbucket``: ``alist_objects`` (parallel key ranges, work stealing), in
  this interpreter (``.venv``);
- ``dataflux-N``: ``gcs-torch-dataflux`` 1.4.0's ``ListingController`` with
  ``max_parallelism`` N, at its default on this machine (``os.cpu_count()``,
  what its datasets pass) and at 8; in ``.venv-bench``;
- ``sequential``: ``google-cloud-storage``'s ``list_blobs``, page after page;
  in ``.venv-bench``;
- ``gcsfs``: ``fs.find(prefix)`` (gcsfs lists a prefix page after page, 1,000
  names a page), in ``.venv-gcsfs`` (gcsfs 2026.x needs google-cloud-storage>=3)
  with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (else it first asks a gRPC API
  what kind of bucket it is, which an HTTP-only endpoint never answers).

Sizes 1,000 and 100,000 objects; names sequential (``img/000000.jpg``),
hashed (``img/<16 hex>.jpg``), and in folders as ImageNet lays them out
(``img/n<8 digits>/n<8 digits>_<n>.JPEG``, 1,300 a folder). Each figure is the median of a few repeats, run
round-robin so that drift hits every contender alike. List calls and the
emulator's own CPU come from the emulator's counters over each measured phase.

    python benchmarks/listing.py --quick

The last line is ``RESULT {json}``: ``speedup_vs_dataflux_100k`` and
``speedup_vs_sequential_100k`` (the worse of the two name distributions,
against dataflux's faster setting), ``ratio_to_sequential_1k`` (torchbucket's
time over the sequential list's, the worse distribution), and
``list_calls_torchbucket_100k`` / ``list_calls_sequential_100k`` (the larger
distribution's); these are the issue's figures, over the sequential and hashed
names. ``speedup_vs_gcsfs_100k`` is over every name shape (the worst), and
``wall_over_cpu_torchbucket_100k`` is torchbucket's wall time over its own
client CPU time (the worst shape; near 1, no round trip left unhidden);
``fanout_s_torchbucket_100k`` is when it first had ``FANOUT_IN_FLIGHT``
requests in flight (the round trips before that find where the names are, the
client idle meanwhile) and ``wall_after_fanout_over_cpu_torchbucket_100k`` the
time after that over the client's CPU (both the worst shape);
``wall_over_cpu_floor_torchbucket_100k`` is the least wall over CPU a listing
that cuts only after seeing a page could reach (its CPU plus the idle until a
request sent on the first page's answer answers: ``idle_floor``), on the shape
where that floor is highest. The folders get their own: ``speedup_vs_dataflux_folders_100k``,
``speedup_vs_sequential_folders_100k`` and ``list_calls_torchbucket_folders_100k``.

Run with a JSON spec as its only argument, this file is the contender itself
(that is how the driver starts each one, in the right interpreter).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "_contenders"))

PREFIX = "img/"
SIZES = (1_000, 100_000)
DISTRIBUTIONS = ("sequential", "hashed", "folders")
# What the issue's figures are taken over (the worse of them).
ISSUE_DISTRIBUTIONS = ("sequential", "hashed")
FOLDER_SIZE = 1_300  # ImageNet's images per class, about
# Set for gcsfs (and said in the output): see the module docstring.
FSSPEC_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def object_names(distribution: str, count: int) -> list[str]:
    """The names of one case, as the issue describes them."""
    if distribution == "sequential":
        return [f"{PREFIX}{i:06d}.jpg" for i in range(count)]
    if distribution == "folders":
        return [
            f"{PREFIX}n{i // FOLDER_SIZE:08d}/n{i // FOLDER_SIZE:08d}_{i % FOLDER_SIZE}.JPEG"
            for i in range(count)
        ]
    # "dated": hashed names in one folder under the prefix (a day's partition);
    # not in DISTRIBUTIONS, for listing_timeline.py --distributions dated.
    stem = f"{PREFIX}2024-01-01/" if distribution == "dated" else PREFIX
    return [
        f"{stem}{hashlib.blake2b(str(i).encode(), digest_size=8).hexdigest()}.jpg"
        for i in range(count)
    ]


# ------------------------------------------------------------------ contenders


# Figures a contender adds to its CONTENDER line (torchbucket's fan-out).
_EXTRA: dict[str, Any] = {}

# In flight at once from which a listing counts as fanned out: more than the
# first page, a probe and a continuation (the chain that finds the names).
FANOUT_IN_FLIGHT = 8


def fanout_s(spans: list[tuple[float, float]], t0: float) -> float:
    """When ``FANOUT_IN_FLIGHT`` requests were first in flight together, from ``t0``.

    ``spans`` are the requests' (sent, answered) times; ``nan`` if never.
    """
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = 0
    for t, step in edges:
        level += step
        if level >= FANOUT_IN_FLIGHT:
            return t - t0
    return float("nan")


def idle_floor(spans: list[tuple[float, float, float]], t0: float, c0: float) -> float:
    """Idle that no listing waiting for its first page could hide, in seconds.

    ``spans`` are the requests' (sent, answered, client CPU when answered)
    times, from ``time.perf_counter`` and ``time.process_time``; ``t0`` and
    ``c0`` those clocks when the listing began. Before the first page nothing
    is known of the names, and a request sent on its answer (the earliest any
    cut can go out) answers a round trip later: until then the client has the
    first page only to work on. Its idle up to that answer is the floor; only
    requests sent blind, before any page is seen, could fill it. 0 when no
    request went out after the first page.
    """
    ordered = sorted(spans)
    if not ordered:
        return 0.0
    first_answer = ordered[0][1]
    later = [s for s in ordered[1:] if s[0] >= first_answer]
    if not later:
        return 0.0
    _, answered, cpu_at = min(later, key=lambda s: s[1])
    return max(0.0, (answered - t0) - (cpu_at - c0))


def _contender_torchbucket(spec: dict[str, Any]) -> tuple[Any, list[str]]:
    import time

    from torchbucket import runtime
    from torchbucket.listing import ListingConfig, alist_objects
    from torchbucket.storage.gcs import GCSConfig, GCSStore

    store = GCSStore(spec["bucket"], config=GCSConfig(endpoint=spec["endpoint"], anonymous=True))
    config = ListingConfig(progress=False, **spec.get("options", {}))
    # Each page request's (sent, answered, client CPU then) times: when the
    # listing fanned out, i.e. how long the round trips that find where the
    # names are took, and the idle no cut could hide (idle_floor).
    spans: list[tuple[float, float, float]] = []

    def timed(call: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            sent = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                spans.append((sent, time.perf_counter(), time.process_time()))

        return wrapper

    store.list_page = timed(store.list_page)  # type: ignore[method-assign]
    store.list_folder = timed(store.list_folder)  # type: ignore[method-assign]
    with _phase(spec) as phase:
        t0, c0 = time.perf_counter(), time.process_time()
        objects = runtime.run(alist_objects(store, spec["prefix"], config=config))
    runtime.run(store.close())
    _EXTRA["fanout_s"] = fanout_s([(s, e) for s, e, _ in spans], t0)
    _EXTRA["idle_floor_s"] = idle_floor(spans, t0, c0)
    return phase, [o.name for o in objects]


def _contender_dataflux(spec: dict[str, Any]) -> tuple[Any, list[str]]:
    from dataflux_core.fast_list import ListingController
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    with _phase(spec) as phase:
        lister = ListingController(
            max_parallelism=int(spec["parallelism"]),
            project="test",
            bucket=spec["bucket"],
            sort_results=True,  # what a DDP job needs; unsorted differs per rank
            prefix=spec["prefix"],
        )
        lister.client = storage.Client(project="test", credentials=AnonymousCredentials())
        listed = lister.run()
    return phase, [name for name, _size in listed]


def _contender_sequential(spec: dict[str, Any]) -> tuple[Any, list[str]]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    with _phase(spec) as phase:
        names = [blob.name for blob in client.list_blobs(spec["bucket"], prefix=spec["prefix"])]
    return phase, names


def _contender_gcsfs(spec: dict[str, Any]) -> tuple[Any, list[str]]:
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs

    fs = gcsfs.GCSFileSystem(endpoint_url=spec["endpoint"], token="anon", skip_instance_cache=True)
    with _phase(spec) as phase:
        found = fs.find(f"{spec['bucket']}/{spec['prefix']}")
    head = f"{spec['bucket']}/"
    return phase, [name[len(head) :] if name.startswith(head) else name for name in found]


def _phase(spec: dict[str, Any]) -> Any:
    from _common import Phase

    return Phase(spec["endpoint"])


def contender_main(spec: dict[str, Any]) -> None:
    """Run one contender on one case and print its ``CONTENDER`` line."""
    from _common import emit

    kind = spec["contender"]
    run = {
        "torchbucket": _contender_torchbucket,
        "dataflux": _contender_dataflux,
        "sequential": _contender_sequential,
        "gcsfs": _contender_gcsfs,
    }[kind]
    phase, names = run(spec)
    expected = object_names(spec["distribution"], spec["count"])
    if sorted(names) != sorted(expected):
        raise SystemExit(f"{kind} listed {len(names)} names, not the {len(expected)} expected")
    if kind != "dataflux" and names != sorted(expected):
        raise SystemExit(f"{kind} listed the names out of order")
    result = phase.result()
    result["objects"] = len(names)
    result["list_calls"] = int((result.get("server") or {}).get("by_op", {}).get("list", 0))
    result |= _EXTRA
    emit(result)


# ---------------------------------------------------------------------- driver


def main() -> None:
    import _harness as h

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 5")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated contenders to run (torchbucket, dataflux-N, sequential): "
        "for iterating; the RESULT line then lacks what was left out",
    )
    parser.add_argument(
        "--distributions",
        default=",".join(DISTRIBUTIONS),
        help="comma-separated: sequential, hashed, folders",
    )
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    sizes = [int(s) for s in args.sizes.split(",")]
    bench = h.bench_python()
    cpus = os.cpu_count() or 1

    contenders: list[tuple[str, str | None, dict[str, Any]]] = [
        ("torchbucket", None, {"contender": "torchbucket"}),
    ]
    if bench is None:
        print("no .venv-bench (benchmarks/setup_bench_env.sh): dataflux and sequential skipped")
    else:
        # Its default (os.cpu_count(), what its datasets pass) and 8.
        for parallelism in sorted({cpus, 8}):
            contenders.append(
                (
                    f"dataflux-{parallelism}",
                    bench,
                    {"contender": "dataflux", "parallelism": parallelism},
                )
            )
        contenders.append(("sequential", bench, {"contender": "sequential"}))
    fsspec = h.fsspec_python()
    if fsspec is None:
        print("no .venv-gcsfs (benchmarks/setup_bench_env.sh): gcsfs skipped")
    else:
        contenders.append(("gcsfs", fsspec, {"contender": "gcsfs"}))
    if args.only:
        wanted = set(args.only.split(","))
        contenders = [c for c in contenders if c[0] in wanted]
    distributions = [d for d in DISTRIBUTIONS if d in args.distributions.split(",")]

    results: dict[str, dict[str, dict[str, float]]] = {}
    # The machine is often shared: say how busy it was, since every contender
    # here competes with other processes for the CPU.
    load_before = os.getloadavg()
    with h.emulator(latency="same-region") as emu:
        for distribution in distributions:
            for count in sizes:
                case = f"{distribution}-{count}"
                bucket = f"list-{distribution}-{count}"
                emu.create_bucket(bucket)
                emu.seed(bucket, ((n, b"x") for n in object_names(distribution, count)))
                runs: dict[str, list[Any]] = {name: [] for name, _, _ in contenders}
                for _ in range(repeats):
                    for name, python, extra in contenders:
                        spec = {
                            **extra,
                            "endpoint": emu.endpoint,
                            "bucket": bucket,
                            "prefix": PREFIX,
                            "count": count,
                            "distribution": distribution,
                        }
                        runs[name].append(
                            h.run_contender(
                                f"listing-{case}-{name}",
                                Path(__file__).resolve(),
                                spec,
                                python=python,
                                env={
                                    "STORAGE_EMULATOR_HOST": emu.endpoint,
                                    **(FSSPEC_ENV if name == "gcsfs" else {}),
                                },
                                timeout=600,
                            )
                        )
                results[case] = {name: h.medians(r) for name, r in runs.items() if r}

    rows = []
    for case, by_name in results.items():
        base = by_name.get("torchbucket", {}).get("data.wall_s", float("nan"))
        for name, med in by_name.items():
            rows.append(
                {
                    "case": case,
                    "contender": name,
                    "wall_s": med["data.wall_s"],
                    "vs_tb": h.ratio(med["data.wall_s"], base),
                    "list_calls": med.get("data.list_calls", float("nan")),
                    "cpu_s": med.get("data.cpu_s", float("nan")),
                    "server_cpu_s": med.get("data.server.cpu_s", float("nan")),
                    "fanout_s": med.get("data.fanout_s", float("nan")),
                    "idle_floor_s": med.get("data.idle_floor_s", float("nan")),
                }
            )
    h.print_table(
        f"Listing {PREFIX} on the emulator (same-region latency), median of {repeats}",
        rows,
        [
            ("case", "case", "s"),
            ("contender", "contender", "s"),
            ("wall_s", "time s", ".3f"),
            ("vs_tb", "x torchbucket", ".2f"),
            ("list_calls", "list calls", ".0f"),
            ("cpu_s", "client CPU s", ".2f"),
            ("server_cpu_s", "server CPU s", ".2f"),
            ("fanout_s", "fanned out at s", ".3f"),
            ("idle_floor_s", "idle floor s", ".3f"),
        ],
    )

    def wall(case: str, name: str) -> float:
        return results.get(case, {}).get(name, {}).get("data.wall_s", float("nan"))

    def calls(case: str, name: str) -> float:
        return results.get(case, {}).get(name, {}).get("data.list_calls", float("nan"))

    big, small = max(sizes), min(sizes)
    dataflux_names = [name for name, _, _ in contenders if name.startswith("dataflux")]
    vs_dataflux, vs_sequential, ratio_small = [], [], []
    for distribution in [d for d in distributions if d in ISSUE_DISTRIBUTIONS]:
        tb = wall(f"{distribution}-{big}", "torchbucket")
        fastest_dataflux = min(
            (wall(f"{distribution}-{big}", n) for n in dataflux_names), default=float("nan")
        )
        vs_dataflux.append(h.ratio(fastest_dataflux, tb))
        vs_sequential.append(h.ratio(wall(f"{distribution}-{big}", "sequential"), tb))
        ratio_small.append(
            h.ratio(
                wall(f"{distribution}-{small}", "torchbucket"),
                wall(f"{distribution}-{small}", "sequential"),
            )
        )
    suffix = f"{big // 1000}k"
    payload = {
        f"speedup_vs_dataflux_{suffix}": min(vs_dataflux, default=float("nan")),
        f"speedup_vs_sequential_{suffix}": min(vs_sequential, default=float("nan")),
        f"ratio_to_sequential_{small // 1000}k": max(ratio_small, default=float("nan")),
        f"list_calls_torchbucket_{suffix}": max(
            calls(f"{d}-{big}", "torchbucket") for d in distributions if d in ISSUE_DISTRIBUTIONS
        ),
        f"list_calls_sequential_{suffix}": max(
            calls(f"{d}-{big}", "sequential") for d in distributions if d in ISSUE_DISTRIBUTIONS
        ),
    }
    # gcsfs and the wall/CPU ratio over every name shape (the worst of them).
    every = [f"{d}-{big}" for d in distributions]

    def cpu(case: str, name: str) -> float:
        return results.get(case, {}).get(name, {}).get("data.cpu_s", float("nan"))

    def worst(values: list[float], *, high: bool = False) -> float:
        known = [v for v in values if v == v]  # nan: a contender left out
        return (max if high else min)(known) if known else float("nan")

    payload[f"speedup_vs_gcsfs_{suffix}"] = worst(
        [h.ratio(wall(c, "gcsfs"), wall(c, "torchbucket")) for c in every]
    )
    payload[f"wall_over_cpu_torchbucket_{suffix}"] = worst(
        [h.ratio(wall(c, "torchbucket"), cpu(c, "torchbucket")) for c in every], high=True
    )

    # The least wall over CPU any listing that cuts after its first page could
    # have (its CPU plus the idle until a second round answers), on the shape
    # where that floor is highest.
    def floor(case: str) -> float:
        return results.get(case, {}).get("torchbucket", {}).get("data.idle_floor_s", float("nan"))

    payload[f"wall_over_cpu_floor_torchbucket_{suffix}"] = worst(
        [h.ratio(cpu(c, "torchbucket") + floor(c), cpu(c, "torchbucket")) for c in every],
        high=True,
    )

    # Before the fan-out the client waits on the round trips that find where
    # the names are (nothing to parse meanwhile); after it, on its own CPU.
    def fanout(case: str) -> float:
        return results.get(case, {}).get("torchbucket", {}).get("data.fanout_s", float("nan"))

    payload[f"fanout_s_torchbucket_{suffix}"] = worst([fanout(c) for c in every], high=True)
    payload[f"wall_after_fanout_over_cpu_torchbucket_{suffix}"] = worst(
        [h.ratio(wall(c, "torchbucket") - fanout(c), cpu(c, "torchbucket")) for c in every],
        high=True,
    )
    payload[f"speedup_vs_dataflux_every_shape_{suffix}"] = worst(
        [
            h.ratio(worst([wall(c, n) for n in dataflux_names]), wall(c, "torchbucket"))
            for c in every
        ]
    )
    if fsspec is not None and any(n == "gcsfs" for n, _, _ in contenders):
        payload["fsspec_versions"] = h.package_versions(fsspec, ("gcsfs", "fsspec"))
        payload["fsspec_env"] = FSSPEC_ENV
        print(
            f"gcsfs {payload['fsspec_versions']} ran with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false"
        )
    if "folders" in distributions:
        case = f"folders-{big}"
        tb = wall(case, "torchbucket")
        payload |= {
            f"speedup_vs_dataflux_folders_{suffix}": h.ratio(
                min((wall(case, n) for n in dataflux_names), default=float("nan")), tb
            ),
            f"speedup_vs_sequential_folders_{suffix}": h.ratio(wall(case, "sequential"), tb),
            f"list_calls_torchbucket_folders_{suffix}": calls(case, "torchbucket"),
        }
    load = {"before": list(load_before), "after": list(os.getloadavg()), "cpus": cpus}
    print(
        f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}; {cpus} CPUs"
    )
    names = [name for name, _, _ in contenders]
    panels = [
        h.Panel(
            f"{case} (median s)",
            names,
            [results[case].get(name, {}).get("data.wall_s") for name in names],
            "seconds",
            log=True,
        )
        for case in results
    ]
    png = h.bar_chart("listing", panels, suptitle=f"Listing {PREFIX}: time per contender", ncols=2)
    h.write_json(
        "listing",
        {
            "repeats": repeats,
            "results": results,
            "summary": payload,
            "load": load,
            "figure": h.rel(png),
        },
    )
    h.emit_result(payload)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1][:1] in ("{", "@"):
        from _common import load_spec

        contender_main(load_spec())
    else:
        main()
