"""Data loading and checkpoints on a zonal (Rapid) bucket of the emulator: torchbucket against gcsfs.

Issue 42 point 6, in one script: both clients talk to the same emulator
(``Emulator(grpc=True)``, model store, ``same-region`` latency unless
``--latency none``) over its gRPC endpoint, each contender in a process of its
own, timed by wall clock and that process's CPU:

- data loading: every object of a prefix (10 KiB and 100 KiB objects), in one
  process: torchbucket's ``BucketIterableDataset`` (the library's defaults;
  on a zonal bucket one bidi stream per object, many in flight) against
  gcsfs's best batched path, ``ExtendedGcsFileSystem.cat`` of the whole list
  (``ZonalFile`` over ``AsyncMultiRangeDownloader``), and torchbucket on a
  regional bucket of the same emulator over the JSON API for scale;
- checkpoints: ``BucketCheckpoint.save``/``load`` of a state dict against
  ``torch.save``/``torch.load`` through ``gcsfs.open`` (its appendable writer
  and its reader), each client warm, by ``_ckpt_zonal.py`` (which
  ``checkpoint.py`` runs too), with the emulator's CPU beside each.

RESULT keys: ``speedup_vs_gcsfs_zonal_{10k,100k,save,load}`` (gcsfs's wall
time over torchbucket's), ``cpu_ms_per_mib_zonal_{contender}_{case}``, and
``speedup_zonal_vs_regional_{10k,100k}`` (torchbucket regional over zonal).
Goals (the issue's): at least 2 for data loading and 1.5 for save and load.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "_contenders"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _ckpt_zonal

KiB, MiB = 1 << 10, 1 << 20


def _data(i: int, n: int) -> bytes:
    return random.Random(i).randbytes(n)


def _gcsfs(args: dict[str, Any]) -> Any:
    from _gcsfs_zonal import zonal_filesystem

    return zonal_filesystem(args["endpoint"], args["grpc_endpoint"])


def _timed(fn: Any) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    got = fn()
    return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "bytes": got}


def run_contender(name: str, args: dict[str, Any]) -> dict[str, float]:
    bucket, case = args["bucket"], args["case"]
    if name.startswith("torchbucket"):
        from torchbucket.datasets import BucketIterableDataset
        from torchbucket.storage.gcs import GCSConfig

        gcs = GCSConfig(endpoint=args["endpoint"], grpc_endpoint=f"http://{args['grpc_endpoint']}")
        ds = BucketIterableDataset.from_prefix(f"gs://{bucket}/{case}/", gcs=gcs)
        return _timed(lambda: sum(len(x) for x in ds))
    fs = _gcsfs(args)
    # The names are known: gcsfs's find on an HNS bucket asks ListFolders,
    # which the emulator does not serve.
    paths = [f"{bucket}/{case}/{i:06d}" for i in range(args["n"])]
    return _timed(lambda: sum(len(v) for v in fs.cat(paths).values()))


CONTENDERS = ("torchbucket", "gcsfs", "torchbucket_regional")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--latency", default="same-region")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.contender:
        print(json.dumps(run_contender(ns.contender, json.loads(sys.stdin.read()))))
        return

    from torchbucket.emulator import Emulator

    scale = 0.1 if ns.smoke else 0.5 if ns.quick else 1.0
    counts = {"10k": int(4000 * scale), "100k": int(1000 * scale)}
    size = int((256 if not ns.smoke else 32) * MiB * (1 if not ns.quick else 0.5))
    repeats = 1 if ns.smoke else 3
    latency = None if ns.latency == "none" else ns.latency
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with Emulator(grpc=True, latency=latency) as emu:
        buckets = {"zonal": "bench-zonal", "regional": "bench-regional"}
        for kind, name in buckets.items():
            emu.create_bucket(name, zonal=kind == "zonal")
            for case, n in counts.items():
                each = 10 * KiB if case == "10k" else 100 * KiB
                emu.seed(name, {f"{case}/{i:06d}": _data(i, each) for i in range(n)})
        for _ in range(repeats):
            for case in ("10k", "100k"):
                for c in CONTENDERS:
                    args = {
                        "endpoint": emu.endpoint,
                        "grpc_endpoint": emu.grpc_endpoint,
                        "bucket": buckets["regional" if c.endswith("regional") else "zonal"],
                        "case": case,
                        "size": size,
                        "n": counts.get(case, 0),
                    }
                    contender = "torchbucket" if c.startswith("torchbucket") else c
                    done = subprocess.run(
                        [sys.executable, __file__, "--contender", contender],
                        input=json.dumps(args),
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    if done.returncode:
                        sys.stderr.write(done.stderr[-3000:])
                        raise SystemExit(f"{c} {case} failed")
                    results.setdefault((c, case), []).append(
                        json.loads(done.stdout.strip().splitlines()[-1])
                    )
        ckpt = _ckpt_zonal.run(emu, buckets["zonal"], size, repeats)
    for c in _ckpt_zonal.CONTENDERS:
        for op in _ckpt_zonal.OPS:
            results[(c, op)] = [{**r, "bytes": size} for r in ckpt[c][op]]

    def med(c: str, case: str, key: str) -> float:
        values = sorted(r[key] for r in results[(c, case)])
        return values[len(values) // 2]

    result: dict[str, Any] = {}
    print(f"{'case':<6}{'contender':<22}{'wall s':>8}{'CPU ms/MiB':>12}")
    for (c, case), _ in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        mib = med(c, case, "bytes") / MiB if case in ("10k", "100k") else size / MiB
        per_mib = med(c, case, "cpu") / mib * 1e3
        result[f"cpu_ms_per_mib_zonal_{c}_{case}"] = round(per_mib, 3)
        print(f"{case:<6}{c:<22}{med(c, case, 'wall'):>8.2f}{per_mib:>12.3f}")
    for case in ("10k", "100k", "save", "load"):
        speedup = med("gcsfs", case, "wall") / med("torchbucket", case, "wall")
        result[f"speedup_vs_gcsfs_zonal_{case}"] = round(speedup, 2)
    for case in ("10k", "100k"):
        ratio = med("torchbucket_regional", case, "wall") / med("torchbucket", case, "wall")
        result[f"speedup_zonal_vs_regional_{case}"] = round(ratio, 2)
    result["goals_met"] = all(
        result[f"speedup_vs_gcsfs_zonal_{c}"] >= (2 if c in ("10k", "100k") else 1.5)
        for c in ("10k", "100k", "save", "load")
    )
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
