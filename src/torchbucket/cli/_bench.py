"""``torchbucket bench``: a quick throughput probe of a bucket prefix.

Writes small objects and one large one under a fresh temporary prefix, lists
them, reads them back (the large one in parallel ranges), checks every byte,
deletes what it wrote, and prints one row per step, then the requests it made
by GCS class and their cost at list prices. Everything it wrote is deleted even
when a step fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from torchbucket import runtime
from torchbucket._uri import join_key
from torchbucket.cli._common import (
    CommandError,
    human_bytes,
    open_target,
    parse_size,
    positive_int,
)
from torchbucket.errors import NotFoundError
from torchbucket.listing import alist_objects
from torchbucket.runtime import accounting
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage import ObjectStore, Part

__all__ = ["BenchRow", "add_bench", "run_bench"]


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One measured step.

    Attributes:
        step: What was done.
        objects: Objects (or requests, for the large object) involved.
        bytes: Bytes moved.
        seconds: Wall time.
    """

    step: str
    objects: int
    bytes: int
    seconds: float


async def _gather_limited(calls: Iterable[Callable[[], Awaitable[object]]], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[object]]) -> None:
        async with gate:
            await call()

    await gather_or_cancel(one(c) for c in calls)


async def _timed(step: str, objects: int, nbytes: int, work: Awaitable[object]) -> BenchRow:
    started = time.perf_counter()
    await work
    return BenchRow(step, objects, nbytes, time.perf_counter() - started)


async def _write_large(store: ObjectStore, key: str, data: bytes, part: int, jobs: int) -> None:
    if len(data) <= part:
        await store.put(key, data)
        return
    upload_id = await store.multipart_initiate(key)
    try:
        view = memoryview(data)
        parts: list[Part] = []

        async def send(number: int, offset: int) -> None:
            parts.append(
                await store.multipart_upload_part(
                    key, upload_id, number, view[offset : offset + part]
                )
            )

        await _gather_limited(
            [partial(send, n, o) for n, o in enumerate(range(0, len(data), part), start=1)],
            jobs,
        )
        await store.multipart_complete(key, upload_id, sorted(parts, key=lambda p: p.number))
    except BaseException:
        await asyncio.shield(store.multipart_abort(key, upload_id))
        raise


async def _read_large(store: ObjectStore, key: str, size: int, part: int, jobs: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    await _gather_limited(
        [partial(store.get_into, key, view[o : o + part], start=o) for o in range(0, size, part)],
        jobs,
    )
    return buffer


async def run_bench(
    store: ObjectStore,
    prefix: str,
    *,
    small_count: int,
    small_size: int,
    large_size: int,
    jobs: int,
    part_size: int = 8 << 20,
) -> list[BenchRow]:
    """Write, list, read and delete under a fresh prefix below ``prefix``.

    Args:
        store: The bucket.
        prefix: Where the temporary prefix goes.
        small_count: How many small objects.
        small_size: Bytes in each small object.
        large_size: Bytes in the large object (0 for none).
        jobs: Requests in flight.
        part_size: Part (and read range) size for the large object.

    Returns:
        One row per step, in order.

    Raises:
        CommandError: Bytes read back differ from what was written.
    """
    base = join_key(prefix, f"torchbucket-bench-{uuid.uuid4().hex[:12]}/")
    bench = _Bench(
        store,
        jobs,
        part_size,
        small=[(f"{base}small/{i:06d}", os.urandom(small_size)) for i in range(small_count)],
        large_key=f"{base}large",
        large=os.urandom(large_size) if large_size else b"",
    )
    try:
        await bench.write()
        await bench.list_back(base)
        await bench.read_back()
    finally:
        started = time.perf_counter()
        count = len(bench.written)
        await asyncio.shield(_delete_all(store, bench.written, jobs))
        bench.rows.append(BenchRow("delete", count, 0, time.perf_counter() - started))
    return bench.rows


@dataclass
class _Bench:
    """The steps of one run, the keys it wrote (to delete) and a row per step."""

    store: ObjectStore
    jobs: int
    part_size: int
    small: list[tuple[str, bytes]]
    large_key: str
    large: bytes
    written: list[str] = field(default_factory=list)
    rows: list[BenchRow] = field(default_factory=list)

    async def write(self) -> None:
        async def put(key: str, data: bytes) -> None:
            await self.store.put(key, data)
            self.written.append(key)

        small_size = len(self.small[0][1]) if self.small else 0
        self.rows.append(
            await _timed(
                "write small",
                len(self.small),
                len(self.small) * small_size,
                _gather_limited([partial(put, k, d) for k, d in self.small], self.jobs),
            )
        )
        if self.large:
            started = time.perf_counter()
            await _write_large(self.store, self.large_key, self.large, self.part_size, self.jobs)
            self.written.append(self.large_key)
            self.rows.append(
                BenchRow("write large", 1, len(self.large), time.perf_counter() - started)
            )

    async def list_back(self, base: str) -> None:
        started = time.perf_counter()
        listed = await alist_objects(self.store, base, progress=False)
        self.rows.append(BenchRow("list", len(listed), 0, time.perf_counter() - started))
        if len(listed) != len(self.written):
            raise CommandError(
                f"listing {self.store.uri(base)} found {len(listed)} objects, "
                f"{len(self.written)} written"
            )

    async def read_back(self) -> None:
        got: dict[str, bytes] = {}

        async def get(key: str) -> None:
            got[key] = await self.store.get(key)

        small_size = len(self.small[0][1]) if self.small else 0
        self.rows.append(
            await _timed(
                "read small",
                len(self.small),
                len(self.small) * small_size,
                _gather_limited([partial(get, k) for k, _ in self.small], self.jobs),
            )
        )
        for key, data in self.small:
            if got[key] != data:
                raise CommandError(f"read back different bytes from {self.store.uri(key)}")
        if self.large:
            started = time.perf_counter()
            back = await _read_large(
                self.store, self.large_key, len(self.large), self.part_size, self.jobs
            )
            self.rows.append(
                BenchRow("read large", 1, len(self.large), time.perf_counter() - started)
            )
            if back != self.large:
                raise CommandError(
                    f"read back different bytes from {self.store.uri(self.large_key)}"
                )


async def _delete_all(store: ObjectStore, keys: list[str], jobs: int) -> None:
    async def delete(key: str) -> None:
        try:
            await store.delete(key)
        except NotFoundError:
            pass

    await _gather_limited([partial(delete, k) for k in keys], jobs)


def format_rows(rows: list[BenchRow]) -> str:
    """The results as an aligned text table."""
    header = (
        f"{'step':<12} {'objects':>8} {'bytes':>10} {'seconds':>8} {'objects/s':>10} {'MB/s':>8}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        rate = row.objects / row.seconds if row.seconds > 0 else 0.0
        mbps = f"{row.bytes / 1e6 / row.seconds:.1f}" if row.bytes and row.seconds > 0 else "-"
        size = human_bytes(row.bytes) if row.bytes else "-"
        lines.append(
            f"{row.step:<12} {row.objects:>8} {size:>10} {row.seconds:>8.3f} {rate:>10.1f} {mbps:>8}"
        )
    return "\n".join(lines)


def add_bench(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``torchbucket bench``."""
    parser = sub.add_parser(
        "bench",
        parents=[common],
        help="probe a bucket's write, list and read throughput",
        description=(
            "Write --small-count objects of --small-size and one of --large-size under a "
            "temporary prefix URI/torchbucket-bench-<random>/, list them, read them back "
            "(the large one in parallel ranges) checking every byte, delete everything it "
            "wrote (also on failure), and print a table. Needs permission to create, read, "
            "list and delete objects; makes about 2 x small-count + 3 requests."
        ),
        epilog="example:\n  torchbucket bench gs://my-bucket/scratch/",
    )
    parser.add_argument("uri", metavar="URI", help="gs://bucket/prefix to probe under")
    parser.add_argument(
        "--small-count", type=positive_int, default=256, help="small objects (default: 256)"
    )
    parser.add_argument(
        "--small-size",
        type=parse_size,
        default=16 << 10,
        metavar="SIZE",
        help="bytes per small object (default: 16KiB)",
    )
    parser.add_argument(
        "--large-size",
        type=parse_size,
        default=64 << 20,
        metavar="SIZE",
        help="bytes in the large object, 0 for none (default: 64MiB)",
    )
    parser.add_argument(
        "-j", "--jobs", type=positive_int, default=64, help="requests in flight (default: 64)"
    )
    parser.set_defaults(func=_bench)


def format_cost(stats: accounting.RequestStats) -> str:
    """Two lines: the requests by class, and their cost at list prices."""
    from torchbucket.runtime.prices import estimate

    retries = f", {stats.retries} retried" if stats.retries else ""
    return (
        f"requests: {stats.class_a:,} class A, {stats.class_b:,} class B, "
        f"{stats.free:,} free{retries}\n"
        f"cost:     {estimate(stats).summary()} (US region, Standard)"
    )


def _bench(args: argparse.Namespace) -> int:
    target = open_target(args.uri, args.endpoint)
    spent = accounting.Measurement()
    try:
        rows = runtime.run(
            run_bench(
                target.store,
                target.key,
                small_count=args.small_count,
                small_size=args.small_size,
                large_size=args.large_size,
                jobs=args.jobs,
            )
        )
    finally:
        runtime.run(target.store.close())
    print(f"bench of {target.uri}")
    print(format_rows(rows))
    print(format_cost(spent.stats))
    return 0
