"""Benchmark: where a torchbucket listing's wall time goes, and A/B against another commit.

Issue 15 asks for a listing whose wall time is within 1.25x of its client CPU
time: the time left over (*idle*: wall less client CPU) is round trips the
client waits on with nothing to parse. This benchmark lists 100k objects on
the emulator (same-region latency, each listing in a fresh process) and
reports, per name shape, the median wall time, client CPU, idle, wall over
CPU, when the listing fanned out (8 requests in flight) and its requests.

``--against REV`` runs the same listing from another commit's ``src/`` (a
temporary ``git worktree``) alternately with this checkout's, repeat by
repeat, so that both sides see the same machine: this VM's speed drifts by
half within minutes, and only interleaved runs compare. ``--timeline`` prints
the last repeat of each side as 10 ms steps: client and server CPU (from
``/proc/<pid>/task/*/schedstat``), requests in flight and answered.

The floor: until a request sent on the first page's answer answers (a round
trip later), the client has only the first page to work on, so its idle up to
then is idle that no listing which waits for a page before it cuts can hide
(``idle floor s``). ``floor wall/CPU`` is the wall over CPU the listing would
have with no idle but that: how close to 1.25 any adaptive cut could come on
this machine.

Figures (RESULT): ``idle_s_<side>_<shape>``, ``wall_over_cpu_<side>_<shape>``,
``idle_floor_s_<side>_<shape>``, ``idle_over_floor_s_<side>_<shape>`` (idle
less the floor: what better cuts could still hide), ``wall_over_cpu_floor_<side>_<shape>``,
``fanout_s_<side>_<shape>`` and ``requests_<side>_<shape>`` (side ``head``,
and ``base`` with ``--against``), ``idle_saved_s_<shape>`` (base less head),
and the emulator's CPU per listing (``server_cpu_s_<side>_<shape>``).

Usage::

    python benchmarks/listing_timeline.py --quick
    python benchmarks/listing_timeline.py --quick --against 8a67ecb --timeline
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _harness as h
import listing

# The child: one listing, its requests' (sent, answered, objects) times.
_CHILD = r"""
import json, sys, time
from torchbucket import runtime
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.storage.gcs import GCSConfig, GCSStore

endpoint, bucket, prefix = sys.argv[1:4]
store = GCSStore(bucket, config=GCSConfig(endpoint=endpoint, anonymous=True))
spans = []

def timed(call):
    async def wrapper(*args, **kwargs):
        sent = time.perf_counter()
        page = await call(*args, **kwargs)
        spans.append((sent, time.perf_counter(), len(page.objects), time.process_time()))
        return page
    return wrapper

store.list_page = timed(store.list_page)
store.list_folder = timed(store.list_folder)  # the delimiter=/ request of folders
print("ready", flush=True)
sys.stdin.readline()
c0, t0 = time.process_time(), time.perf_counter()
objects = runtime.run(alist_objects(store, prefix, config=ListingConfig(progress=False)))
t1 = time.perf_counter()
cpu = time.process_time() - c0
runtime.run(store.close())
print(json.dumps({"t0": t0, "c0": c0, "t1": t1, "cpu": cpu, "objects": len(objects),
                  "spans": spans}))
"""


def _cpu_ns(pid: int) -> int:
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(path).read_text().split()[0])
    return total


@contextlib.contextmanager
def _checkout(rev: str) -> Iterator[Path]:
    """``src/`` of ``rev`` in a temporary worktree."""
    with tempfile.TemporaryDirectory(prefix="tb-ab-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(h.ROOT), "worktree", "add", "-q", "--detach", str(tree), rev],
            check=True,
        )
        try:
            yield tree / "src"
        finally:
            subprocess.run(
                ["git", "-C", str(h.ROOT), "worktree", "remove", "--force", str(tree)],
                check=False,
            )


def _one(src: Path, endpoint: str, bucket: str, server_pid: int, *, sample: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, endpoint, bucket, listing.PREFIX],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise SystemExit(f"the listing child from {src} did not start")
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), _cpu_ns(child.pid), _cpu_ns(server_pid)))
            time.sleep(0.002)

    thread = threading.Thread(target=sampler, daemon=True) if sample else None
    server0 = _cpu_ns(server_pid)
    if thread is not None:
        thread.start()
    child.stdin.write("\n")
    child.stdin.flush()
    out = child.stdout.read()
    if child.wait() != 0:
        raise SystemExit(f"the listing child from {src} failed")
    stop.set()
    if thread is not None:
        thread.join()
    result: dict[str, Any] = json.loads(out)
    result["server_cpu"] = (_cpu_ns(server_pid) - server0) / 1e9
    result["samples"] = samples
    return result


def _figures(run: dict[str, Any], count: int) -> dict[str, float]:
    if run["objects"] != count:
        raise SystemExit(f"listed {run['objects']} objects, not {count}")
    t0, wall, cpu = run["t0"], run["t1"] - run["t0"], run["cpu"]
    spans = [(s - t0, e - t0) for s, e, _, _ in run["spans"]]
    floor = listing.idle_floor([(s, e, c) for s, e, _, c in run["spans"]], run["t0"], run["c0"])
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "idle_s": wall - cpu,
        "wall_over_cpu": wall / cpu,
        "idle_floor_s": floor,
        "idle_over_floor_s": wall - cpu - floor,
        "wall_over_cpu_floor": (cpu + floor) / cpu,
        "fanout_s": listing.fanout_s(spans, 0.0),
        "requests": len(spans),
        "server_cpu_s": run["server_cpu"],
    }


def _timeline(run: dict[str, Any]) -> list[str]:
    t0, t1, samples = run["t0"], run["t1"], run["samples"]
    rows, step = [], 0.01
    for i in range(int((t1 - t0) / step) + 1):
        lo, hi = t0 + i * step, t0 + (i + 1) * step
        before = [s for s in samples if s[0] < lo]
        inside = [s for s in samples if lo <= s[0] < hi]
        if not before or not inside:
            continue
        (ta, ca, sa), (tb, cb, sb) = before[-1], inside[-1]
        flight = sum(1 for s, e, _, _ in run["spans"] if s < hi and e > lo)
        answered = sum(1 for _, e, _, _ in run["spans"] if lo <= e < hi)
        rows.append(
            f"  {i * step:5.2f} s  client {(cb - ca) / 1e9 / (tb - ta):4.2f}  "
            f"server {(sb - sa) / 1e9 / (tb - ta):4.2f}  in flight {flight:3d}  "
            f"answered {answered}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 repeats a side instead of 9")
    parser.add_argument("--smoke", action="store_true", help="1 repeat of 5,000 objects")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--distributions", default="sequential,hashed")
    parser.add_argument("--against", default=None, help="a git revision to compare with")
    parser.add_argument("--timeline", action="store_true", help="print 10 ms steps")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.smoke else 5 if args.quick else 9)
    if args.smoke:
        args.count = 5_000
    distributions = args.distributions.split(",")
    load_before = os.getloadavg()
    sides: dict[str, Path] = {"head": h.ROOT / "src"}
    with contextlib.ExitStack() as stack:
        if args.against:
            sides["base"] = stack.enter_context(_checkout(args.against))
        emu = stack.enter_context(h.emulator(latency="same-region"))
        if emu.pid is None:
            raise SystemExit("the emulator has no process to measure")
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for distribution in distributions:
            bucket = f"timeline-{distribution}"
            emu.create_bucket(bucket)
            emu.seed(bucket, ((n, b"x") for n in listing.object_names(distribution, args.count)))
            # A first listing warms the server's index of the bucket (not counted).
            _one(sides["head"], emu.endpoint, bucket, emu.pid, sample=False)
            for rep in range(repeats):
                for side, src in sides.items():
                    last = args.timeline and rep == repeats - 1
                    run = _one(src, emu.endpoint, bucket, emu.pid, sample=last)
                    runs.setdefault((side, distribution), []).append(run)
    payload: dict[str, Any] = {}
    rows = []
    for (side, distribution), side_runs in runs.items():
        figures = [_figures(r, args.count) for r in side_runs]
        med = {k: h.median([f[k] for f in figures]) for k in figures[0]}
        for key in (
            "idle_s",
            "wall_over_cpu",
            "idle_floor_s",
            "idle_over_floor_s",
            "wall_over_cpu_floor",
            "fanout_s",
            "requests",
            "server_cpu_s",
        ):
            payload[f"{key}_{side}_{distribution}"] = med[key]
        rows.append({"case": distribution, "side": side, **med})
        if args.timeline:
            print(f"\n{side} {distribution}, last repeat:")
            print("\n".join(_timeline(side_runs[-1])))
    if "base" in sides:
        for distribution in distributions:
            payload[f"idle_saved_s_{distribution}"] = (
                payload[f"idle_s_base_{distribution}"] - payload[f"idle_s_head_{distribution}"]
            )
    print()
    h.print_table(
        f"Listing {args.count:,} objects on the emulator (same-region latency), "
        f"median of {repeats}"
        + (f", head against {args.against} interleaved" if args.against else ""),
        rows,
        [
            ("case", "names", "s"),
            ("side", "side", "s"),
            ("wall_s", "wall s", ".3f"),
            ("cpu_s", "client CPU s", ".3f"),
            ("idle_s", "idle s", ".3f"),
            ("wall_over_cpu", "wall/CPU", ".2f"),
            ("idle_floor_s", "idle floor s", ".3f"),
            ("wall_over_cpu_floor", "floor wall/CPU", ".2f"),
            ("fanout_s", "fanned out at s", ".3f"),
            ("requests", "requests", ".0f"),
            ("server_cpu_s", "server CPU s", ".3f"),
        ],
    )
    print(f"\nload average before {load_before}, after {os.getloadavg()}")
    h.write_json("listing_timeline", {"against": args.against, "rows": rows, "result": payload})
    labels = [f"{r['case']}\n{r['side']}" for r in rows]
    h.bar_chart(
        "listing_timeline",
        [
            h.Panel("client CPU s", labels, [r["cpu_s"] for r in rows], ylabel="s"),
            h.Panel("idle s (wall less CPU)", labels, [r["idle_s"] for r in rows], ylabel="s"),
            h.Panel("wall / client CPU", labels, [r["wall_over_cpu"] for r in rows], goal=1.25),
        ],
        suptitle=f"Listing {args.count:,} objects: where the wall time goes",
    )
    h.emit_result(payload)


if __name__ == "__main__":
    main()
