"""Client CPU of a zonal bucket's reads: torchbucket's gRPC path against google-cloud-storage's.

Issue 42 asks which client the gRPC path should use: google-cloud-storage's
``google.cloud.storage.asyncio`` (``AsyncMultiRangeDownloader``, on proto-plus
messages and google-api-core's bidi wrappers), or ``grpc.aio`` with the raw
protobuf messages of google.storage.v2, as torchbucket's ``GCSStore`` does on
a zonal bucket. Both read the same zonal bucket of the emulator
(``Emulator(grpc=True)``, no latency model, model store), each contender in a
process of its own, timed by that process's CPU (``time.process_time``: every
thread, gRPC's poller included):

- small objects: ``N`` objects of 10 KiB, 64 reads in flight, one bidi stream
  per object (client CPU per object);
- one large object: 256 MiB (``--quick`` 64 MiB) in 8 MiB ranges, 8 in flight
  (torchbucket shares one stream among a generation's concurrent ranges; the
  downloader is one stream carrying every range): client CPU per MiB.

torchbucket over the JSON API on a regional bucket of the same emulator is
shown beside them for scale. Every byte is checked against the data seeded.

RESULT keys: ``cpu_us_per_object_zonal_{torchbucket,gcs_asyncio,http}``,
``cpu_ms_per_mib_zonal_{...}``, and ``cpu_ratio_zonal_small`` /
``cpu_ratio_zonal_large`` (google-cloud-storage's CPU over torchbucket's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from typing import Any

KiB, MiB = 1 << 10, 1 << 20
SMALL = 10 * KiB
IN_FLIGHT = 64
RANGE = 8 * MiB
RANGES_IN_FLIGHT = 8


def _data(i: int, n: int) -> bytes:
    return random.Random(i).randbytes(n)


# ------------------------------------------------------------------ contenders


def _torchbucket(args: dict[str, Any]) -> dict[str, float]:
    from torchbucket import runtime
    from torchbucket.storage.gcs import GCSConfig, GCSStore

    grpc = args["mode"] == "grpc"
    config = GCSConfig(
        endpoint=args["endpoint"],
        grpc_endpoint=f"http://{args['grpc_endpoint']}" if grpc else None,
        transport="grpc" if grpc else "http",
    )
    store = GCSStore(args["bucket"], config=config)
    names = [f"small/{i:06d}" for i in range(args["n"])]

    async def small() -> int:
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(name: str) -> int:
            async with sem:
                return len(await store.get(name))

        return sum(await asyncio.gather(*(one(n) for n in names)))

    async def large() -> int:
        size = args["large"]
        buf = bytearray(size)
        view = memoryview(buf)
        sem = asyncio.Semaphore(RANGES_IN_FLIGHT)

        async def one(at: int) -> int:
            async with sem:
                return await store.get_into("large", view[at : at + RANGE], start=at)

        got = sum(await asyncio.gather(*(one(at) for at in range(0, size, RANGE))))
        checks.append(bytes(buf[:4096]))
        return got

    checks: list[bytes] = []

    runtime.run(store.get(names[0]))  # warm: channel, layout, session
    out: dict[str, float] = {}
    for what, job in (("small", small), ("large", large)):
        cpu = time.process_time()
        wall = time.perf_counter()
        got = runtime.run(job())
        out[f"{what}_cpu"] = time.process_time() - cpu
        out[f"{what}_wall"] = time.perf_counter() - wall
        out[f"{what}_bytes"] = got
    assert checks == [_data(-1, args["large"])[:4096]]
    return out


def _gcs_asyncio(args: dict[str, Any]) -> dict[str, float]:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient
    from google.cloud.storage.asyncio.async_multi_range_downloader import (
        AsyncMultiRangeDownloader,
    )

    bucket = args["bucket"]
    names = [f"small/{i:06d}" for i in range(args["n"])]

    async def main() -> dict[str, float]:
        client = AsyncGrpcClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=args["grpc_endpoint"]),
        )

        async def read(name: str, ranges: list[tuple[int, int]]) -> list[bytes]:
            import io

            mrd = await AsyncMultiRangeDownloader.create_mrd(client, bucket, name)
            bufs = [io.BytesIO() for _ in ranges]
            await mrd.download_ranges([(s, n, b) for (s, n), b in zip(ranges, bufs, strict=True)])
            await mrd.close()
            return [b.getvalue() for b in bufs]

        await read(names[0], [(0, 0)])  # warm
        out: dict[str, float] = {}
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(name: str) -> int:
            async with sem:
                return len((await read(name, [(0, 0)]))[0])

        cpu, wall = time.process_time(), time.perf_counter()
        out["small_bytes"] = sum(await asyncio.gather(*(one(n) for n in names)))
        out["small_cpu"], out["small_wall"] = time.process_time() - cpu, time.perf_counter() - wall
        size = args["large"]
        cpu, wall = time.process_time(), time.perf_counter()
        parts = await read("large", [(at, min(RANGE, size - at)) for at in range(0, size, RANGE)])
        out["large_bytes"] = sum(map(len, parts))
        out["large_cpu"], out["large_wall"] = time.process_time() - cpu, time.perf_counter() - wall
        assert parts[0][:4096] == _data(-1, size)[:4096]
        return out

    return asyncio.run(main())


CONTENDERS = {
    "torchbucket": lambda a: _torchbucket({**a, "mode": "grpc"}),
    "gcs_asyncio": _gcs_asyncio,
    "http": lambda a: _torchbucket({**a, "mode": "http"}),
}


# ------------------------------------------------------------------ driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.contender:
        args = json.loads(sys.stdin.read())
        print(json.dumps(CONTENDERS[ns.contender](args)))
        return

    from torchbucket.emulator import Emulator

    n, large = (200, 16 * MiB) if ns.smoke else (2000, 64 * MiB) if ns.quick else (5000, 256 * MiB)
    repeats = ns.repeats or (1 if ns.smoke else 3)
    with Emulator(grpc=True, latency="none") as emu:
        results: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
        buckets = {"zonal": "bench-zonal", "regional": "bench-regional"}
        for kind, name in buckets.items():
            emu.create_bucket(name, zonal=kind == "zonal")
            emu.seed(name, {f"small/{i:06d}": _data(i, SMALL) for i in range(n)})
            emu.seed(name, {"large": _data(-1, large)})
        for _ in range(repeats):
            for contender in CONTENDERS:
                bucket = buckets["regional" if contender == "http" else "zonal"]
                args = {
                    "endpoint": emu.endpoint,
                    "grpc_endpoint": emu.grpc_endpoint,
                    "bucket": bucket,
                    "n": n,
                    "large": large,
                }
                done = subprocess.run(
                    [sys.executable, __file__, "--contender", contender],
                    input=json.dumps(args),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if done.returncode:
                    sys.stderr.write(done.stderr)
                    raise SystemExit(f"{contender} failed")
                got = json.loads(done.stdout.strip().splitlines()[-1])
                assert got["small_bytes"] == n * SMALL and got["large_bytes"] == large
                results[contender].append(got)

    def median(c: str, key: str) -> float:
        values = sorted(r[key] for r in results[c])
        return values[len(values) // 2]

    result: dict[str, Any] = {}
    print(f"{'contender':<14}{'us CPU/object':>15}{'ms CPU/MiB':>12}{'small s':>9}{'large s':>9}")
    for c in CONTENDERS:
        per_obj = median(c, "small_cpu") / n * 1e6
        per_mib = median(c, "large_cpu") / (large / MiB) * 1e3
        result[f"cpu_us_per_object_zonal_{c}"] = round(per_obj, 1)
        result[f"cpu_ms_per_mib_zonal_{c}"] = round(per_mib, 3)
        print(
            f"{c:<14}{per_obj:>15.1f}{per_mib:>12.3f}"
            f"{median(c, 'small_wall'):>9.2f}{median(c, 'large_wall'):>9.2f}"
        )
    tb, g = "cpu_us_per_object_zonal_torchbucket", "cpu_us_per_object_zonal_gcs_asyncio"
    result["cpu_ratio_zonal_small"] = round(result[g] / result[tb], 2)
    tb, g = "cpu_ms_per_mib_zonal_torchbucket", "cpu_ms_per_mib_zonal_gcs_asyncio"
    result["cpu_ratio_zonal_large"] = round(result[g] / result[tb], 2)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
