"""Checkpoints on a zonal (Rapid) bucket of the emulator: torchbucket against gcsfs.

Shared by ``benchmarks/zonal.py`` and ``benchmarks/checkpoint.py`` (issue 42):
both clients talk to the same ``Emulator(grpc=True)`` (model store,
``same-region`` latency unless told otherwise) over its gRPC endpoint. Each
repeat runs one process per contender, the order alternating, that saves a
state dict of one ``uint8`` tensor and then loads it back (checked byte for
byte against what was saved):

- torchbucket: ``BucketCheckpoint.save`` / ``.load`` (a data object streamed
  over ``BidiWriteObject`` while ``torch.save`` writes, checked, then the
  pointer; the load's ranges over ``BidiReadObject`` into a memfd that
  ``torch.load(mmap=True)`` maps);
- gcsfs: ``torch.save`` / ``torch.load`` through ``gcsfs.open`` (its
  ``ZonalFile``: google-cloud-storage's ``AsyncAppendableObjectWriter`` and
  ``AsyncMultiRangeDownloader``).

Each phase is timed by wall clock and by the process's CPU, and the
emulator's CPU over the same phase is read from ``/proc`` (is the server the
bottleneck?). Run alone (``python benchmarks/_ckpt_zonal.py --quick``) it ends
with ``RESULT {json}``: ``speedup_vs_gcsfs_zonal_{save,load}`` (gcsfs's median
wall time over torchbucket's; goal 1.5), ``client_cpu_ms_per_mib_zonal_{save,load}``
(torchbucket's), ``gcsfs_cpu_ms_per_mib_zonal_{save,load}`` and
``emulator_cpu_ms_per_mib_zonal_{contender}_{save,load}``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "_contenders"))

MiB = 1 << 20
CONTENDERS = ("torchbucket", "gcsfs")
OPS = ("save", "load")
GOAL = 1.5


def _state(size: int) -> dict[str, Any]:
    import torch

    data = bytearray(os.urandom(size))
    return {"w": torch.frombuffer(data, dtype=torch.uint8)}


def _emu_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, summed by name: Python
    threads by their ``threading`` name, the others (gRPC's) by the kernel's."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = names.get(int(tid)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _loop_thread() -> Any:
    """torchbucket's event loop, if this process started it (its thread does the receiving)."""
    if "torchbucket.runtime" not in sys.modules:
        return None
    from torchbucket import runtime

    return runtime.get_loop()


def _phase(fn: Any, emu_pid: int, profile: str | None) -> dict[str, Any]:
    prof = loop_prof = None
    loop = _loop_thread()
    if profile:
        import cProfile

        prof = cProfile.Profile()
        if loop is not None:  # cProfile sees one thread: profile the loop's too
            loop_prof = cProfile.Profile()
            loop.call_soon_threadsafe(loop_prof.enable)
    threads0 = _threads_cpu()
    emu0, cpu0, wall0 = _emu_cpu(emu_pid), time.process_time(), time.perf_counter()
    got = fn() if prof is None else prof.runcall(fn)
    out = {
        "wall": time.perf_counter() - wall0,
        "cpu": time.process_time() - cpu0,
        "emu_cpu": _emu_cpu(emu_pid) - emu0,
    }
    threads = {
        name: round(cpu - threads0.get(name, 0.0), 3) for name, cpu in _threads_cpu().items()
    }
    out["threads"] = {name: cpu for name, cpu in threads.items() if cpu > 0}
    if prof is not None and profile:
        prof.dump_stats(profile)
    if loop_prof is not None and loop is not None and profile:
        import concurrent.futures

        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        loop.call_soon_threadsafe(lambda: (loop_prof.disable(), done.set_result(None)))
        done.result(10)
        loop_prof.dump_stats(f"{profile}.loop")
    return {**out, "value": got}


def _gcsfs(args: dict[str, Any]) -> Any:
    from _gcsfs_zonal import zonal_filesystem

    return zonal_filesystem(args["endpoint"], args["grpc_endpoint"])


def _save_load(name: str, args: dict[str, Any]) -> tuple[Any, Any]:
    """The contender's save and load of ``state`` (callables), its client warm."""
    import torch

    bucket = args["bucket"]
    if name == "torchbucket":
        from torchbucket.checkpoint import BucketCheckpoint
        from torchbucket.storage.gcs import GCSConfig

        gcs = GCSConfig(endpoint=args["endpoint"], grpc_endpoint=f"http://{args['grpc_endpoint']}")
        ck = BucketCheckpoint(gcs=gcs)
        uri = f"gs://{bucket}/ck/tb.pt"
        ck.exists(uri)  # a warm client, as a training job's is
        return (lambda state: ck.save(state, uri)), (lambda: ck.load(uri))
    fs = _gcsfs(args)
    path = f"{bucket}/ck/gcsfs.pt"
    fs.exists(path)

    def save(state: Any) -> None:
        with fs.open(path, "wb") as f:
            torch.save(state, f)

    def load() -> Any:
        with fs.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()))

    return save, load


def run_contender(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One save and one load by contender ``name``, in this process."""
    import torch

    state = _state(args["size"])
    save, load = _save_load(name, args)
    prof = args.get("profile")
    saved = _phase(lambda: save(state), args["emu_pid"], prof and f"{prof}.{name}.save.prof")
    loaded = _phase(load, args["emu_pid"], prof and f"{prof}.{name}.load.prof")
    if not torch.equal(loaded.pop("value")["w"], state["w"]):
        raise SystemExit(f"{name}: the loaded checkpoint differs from the saved one")
    saved.pop("value")
    return {"save": saved, "load": loaded}


def run(
    emu: Any, bucket: str, size: int, repeats: int, profile: str | None = None
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """``repeats`` save+load per contender against ``emu``'s zonal ``bucket``, alternated."""
    pid = int(emu.stats()["pid"])
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        c: {op: [] for op in OPS} for c in CONTENDERS
    }
    for i in range(repeats):
        order = CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]
        for c in order:
            args = {
                "endpoint": emu.endpoint,
                "grpc_endpoint": emu.grpc_endpoint,
                "bucket": bucket,
                "size": size,
                "emu_pid": pid,
                "profile": profile if i == 0 else None,
            }
            done = subprocess.run(
                [sys.executable, __file__, "--contender", c],
                input=json.dumps(args),
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                sys.stderr.write(done.stderr[-3000:])
                raise SystemExit(f"zonal checkpoint: {c} failed")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            for op in OPS:
                runs[c][op].append(got[op])
    return runs


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _print_threads(runs: dict[str, dict[str, list[dict[str, Any]]]], mib: float) -> None:
    """Each contender's client CPU per MiB by thread (medians, runs without a thread as 0)."""
    print("client CPU ms/MiB by thread (medians; the others under 0.05):")
    for op in OPS:
        for c in CONTENDERS:
            rs = runs[c][op]
            names = sorted({n for r in rs for n in r.get("threads", {})})
            each = {
                n: _median([r.get("threads", {}).get(n, 0.0) for r in rs]) / mib * 1e3
                for n in names
            }
            shown = ", ".join(
                f"{n} {v:.2f}" for n, v in sorted(each.items(), key=lambda kv: -kv[1]) if v >= 0.05
            )
            print(f"  {op:<6}{c:<13}{shown}")


def summarize(runs: dict[str, dict[str, list[dict[str, float]]]], size: int) -> dict[str, Any]:
    """The RESULT keys of :func:`run`'s runs (see the module), and a table printed."""
    mib = size / MiB
    out: dict[str, Any] = {}
    print(f"zonal checkpoint, {mib:.0f} MiB, medians of {len(runs['torchbucket']['save'])}:")
    print(
        f"{'op':<6}{'contender':<13}{'wall s':>8}{'MiB/s':>8}{'CPU ms/MiB':>12}{'emu ms/MiB':>12}"
        "  wall s, each run"
    )
    for op in OPS:
        for c in CONTENDERS:
            rs = runs[c][op]
            wall = _median([r["wall"] for r in rs])
            cpu = _median([r["cpu"] for r in rs]) / mib * 1e3
            emu = _median([r["emu_cpu"] for r in rs]) / mib * 1e3
            each = " ".join(f"{r['wall']:.2f}" for r in rs)
            print(f"{op:<6}{c:<13}{wall:>8.2f}{mib / wall:>8.0f}{cpu:>12.2f}{emu:>12.2f}  {each}")
            prefix = "client" if c == "torchbucket" else c
            out[f"{prefix}_cpu_ms_per_mib_zonal_{op}"] = round(cpu, 3)
            out[f"emulator_cpu_ms_per_mib_zonal_{c}_{op}"] = round(emu, 3)
        tb = _median([r["wall"] for r in runs["torchbucket"][op]])
        gf = _median([r["wall"] for r in runs["gcsfs"][op]])
        out[f"speedup_vs_gcsfs_zonal_{op}"] = round(gf / tb, 3)
    _print_threads(runs, mib)
    out["zonal_goals_met"] = all(out[f"speedup_vs_gcsfs_zonal_{op}"] >= GOAL for op in OPS)
    return out


def measure(
    size_mib: int, repeats: int, latency: str | None = "same-region", profile: str | None = None
) -> dict[str, Any]:
    """A fresh emulator with a zonal bucket, :func:`run` and :func:`summarize`."""
    from torchbucket.emulator import Emulator

    with Emulator(grpc=True, latency=latency) as emu:
        emu.create_bucket("bench-zonal-ckpt", zonal=True)
        runs = run(emu, "bench-zonal-ckpt", size_mib * MiB, repeats, profile)
    result = summarize(runs, size_mib * MiB)
    result.update(zonal_size_mib=size_mib, zonal_repeats=repeats)
    return result


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--zonal-mib`` for a benchmark that runs :func:`case` (``checkpoint.py``)."""
    parser.add_argument(
        "--zonal-mib",
        type=int,
        default=None,
        help="state dict of the zonal case (--only's key: zonal): torchbucket against gcsfs "
        "over gRPC on a zonal bucket (default 128 with --quick, 16 with --smoke, else 256; 0: "
        "none)",
    )


def case(args: argparse.Namespace) -> dict[str, Any]:
    """The zonal case of ``checkpoint.py`` (its ``--quick``/``--smoke``, ``--repeats``
    and first latency preset): the RESULT keys of :func:`measure`, or none (not in
    ``--only``, ``--zonal-mib 0``, or without grpcio and gcsfs, which it says)."""
    size = args.zonal_mib
    if size is None:
        size = 16 if args.smoke else 128 if args.quick else 256
    if not size or (args.only and "zonal" not in args.only.split(",")):
        return {}
    try:
        import gcsfs  # noqa: F401
        import grpc  # noqa: F401
    except ImportError as exc:
        print(f"zonal checkpoint case skipped: {exc} (pip install 'torchbucket[rapid]' gcsfs)")
        return {"zonal_skipped": str(exc)}
    repeats = 1 if args.smoke else max(args.repeats, 5)
    return measure(size, repeats, args.presets[0] if args.presets else "same-region")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="128 MiB")
    p.add_argument("--smoke", action="store_true", help="16 MiB, once")
    p.add_argument("--size-mib", type=int, default=None, help="state dict size (256)")
    p.add_argument("--repeats", type=int, default=None, help="save+load per contender (5)")
    p.add_argument("--latency", default="same-region", help="emulator preset, or none")
    p.add_argument("--profile", default=None, help="cProfile files PREFIX.{contender}.{op}.prof")
    p.add_argument("--contender", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.contender:
        print(json.dumps(run_contender(ns.contender, json.loads(sys.stdin.read()))))
        return
    size = ns.size_mib or (16 if ns.smoke else 128 if ns.quick else 256)
    repeats = ns.repeats or (1 if ns.smoke else 5)
    latency = None if ns.latency == "none" else ns.latency
    result = measure(size, repeats, latency, ns.profile)
    print("RESULT " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
