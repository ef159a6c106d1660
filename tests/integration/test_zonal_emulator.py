"""Datasets, shards, checkpoints, DCP and Lightning on a zonal bucket of the emulator, over gRPC.

The emulator serves google.storage.v2 (``Emulator(grpc=True)``) and makes
zonal buckets that refuse compose, copy and XML multipart as GCS does. The
store finds the bucket zonal by itself (``GCSConfig.transport="auto"``, given
the emulator's gRPC endpoint) and the user code is what it is on a regional
bucket. Faults: a read stream broken mid-range resumes; a write stream broken
at a flush resumes; a save that fails leaves the previous checkpoint.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.compose import ComposeConfig
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketMapDataset
from torchbucket.emulator import Emulator
from torchbucket.errors import StorageError
from torchbucket.shards import BucketShardDataset, BucketShardMapDataset, PackConfig, pack
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.pages import list_all

pytestmark = pytest.mark.emulator
pytest.importorskip("grpc")

N = 150
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture(autouse=True)
def _no_faults(emu: Emulator) -> Iterator[None]:
    yield
    emu.clear_faults()


def _gcs(emu: Emulator) -> GCSConfig:
    assert emu.grpc_endpoint is not None
    # No hedged reads: tests here count streams, and a hedge on a busy machine
    # is one more (test_hedged_reads.py hedges on zonal buckets).
    return GCSConfig(
        endpoint=emu.endpoint,
        grpc_endpoint=f"http://{emu.grpc_endpoint}",
        retry=RETRY,
        hedge=HedgeConfig(enabled=False),
    )


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(1000 + 37 * i)


@pytest.fixture
def bucket(emu: Emulator) -> str:
    name = f"zonal-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=True)
    emu.seed(name, {f"raw/{i:05d}.bin": payload(i) for i in range(N)})
    return name


def test_the_store_finds_the_bucket_zonal_and_takes_grpc(emu: Emulator, bucket: str) -> None:
    store = GCSStore(bucket, config=_gcs(emu))
    emu.reset_stats()
    assert runtime.run(store.zonal())
    assert runtime.run(store.get("raw/00003.bin")) == payload(3)
    stats = emu.stats()
    assert stats["by_rpc"].get("BidiReadObject") == 1
    assert "get" not in {op for op in stats["by_op"] if stats["by_rpc"].get(op)}


def test_concurrent_first_reads_ask_the_buckets_kind_once(emu: Emulator, bucket: str) -> None:
    # A DataLoader worker's first reads start together; each asked the
    # bucket's layout (16 in flight: 16 buckets.get) before the first answer.
    import asyncio

    store = GCSStore(bucket, config=_gcs(emu))
    emu.reset_stats()

    async def read_all() -> list[bytes]:
        return await asyncio.gather(*(store.get(f"raw/{i:05d}.bin") for i in range(16)))

    assert runtime.run(read_all()) == [payload(i) for i in range(16)]
    assert emu.stats()["by_op"]["bucket_get"] == 1


def test_map_and_iterable_datasets_through_fork_workers(emu: Emulator, bucket: str) -> None:
    assert emu.grpc_endpoint is not None
    emu.reset_stats()
    script = Path(__file__).with_name("_zonal_loader.py")
    done = subprocess.run(
        [sys.executable, str(script), emu.endpoint, emu.grpc_endpoint, bucket, str(N)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stats = emu.stats()
    assert "compose" not in stats["by_op"]
    # Every sample of both epochs over gRPC, in the workers: no JSON media GET.
    assert stats["by_rpc"]["BidiReadObject"] >= 2 * N
    assert "a zonal (Rapid) bucket has no compose" in done.stderr
    assert "take the JSON API" not in done.stderr


def test_a_worker_forked_after_grpc_was_used_reads_over_json(emu: Emulator, bucket: str) -> None:
    # This test process has used gRPC: its fork workers must not (gRPC hangs
    # or crashes in a child); they take the JSON API, and still never compose.
    store = GCSStore(bucket, config=_gcs(emu))
    assert runtime.run(store.get("raw/00001.bin")) == payload(1)
    ds = BucketMapDataset.from_prefix(
        f"gs://{bucket}/raw/", gcs=_gcs(emu), compose=ComposeConfig(allow_with_soft_delete=True)
    )
    loader = DataLoader(
        ds,
        batch_size=16,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda b: [bytes(x) for x in b],
    )
    emu.reset_stats()
    assert sorted(x for batch in loader for x in batch) == sorted(payload(i) for i in range(N))
    assert "compose" not in emu.stats()["by_op"]


def _read_in_a_forked_child(store: GCSStore, key: str, generation: int) -> list[object]:
    import multiprocessing

    def child(out: multiprocessing.Queue[list[object]]) -> None:
        try:
            out.put(read())
        except Exception as exc:
            out.put([repr(exc)])

    def read() -> list[object]:
        info = runtime.run(store.head(key))
        pinned = runtime.run(store.get(key, generation=generation))
        into = bytearray(info.size)
        runtime.run(store.get_into(key, memoryview(into), generation=generation))
        streamed = b"".join(_chunks(store, key))
        listed = [(i.name, i.size, i.generation) for i in runtime.run(list_all(store, key))]
        return [info.size, info.generation, pinned, bytes(into), streamed, listed]

    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[list[object]] = ctx.Queue()
    proc = ctx.Process(target=child, args=(out,))
    proc.start()
    try:  # before join: the answer is larger than a pipe holds
        got = out.get(timeout=60)
    except queue.Empty:
        proc.join(5)
        pytest.fail(f"the forked child gave no answer (exit code {proc.exitcode})")
    proc.join(60)
    assert len(got) > 1, got[0]
    return got


def _chunks(store: GCSStore, key: str) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [c async for c in store.stream(key, chunk_size=4096)]

    return runtime.run(collect())


def test_a_process_forked_after_grpc_was_used_follows_pointers_over_json(
    emu: Emulator, bucket: str
) -> None:
    # A checkpoint-sized write is a pointer to a hidden data object; a forked
    # child reads over the JSON API and must still read the data object's
    # bytes, pinned to the generation a listing gave (it read the empty
    # pointer, or 404 for a pinned read, before).
    store = GCSStore(bucket, config=_gcs(emu))
    data = random.Random(7).randbytes(3 * 1024 * 1024 + 5)

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(data), 1 << 20):
            yield data[at : at + (1 << 20)]

    info = runtime.run(store.put_stream("ckpt/big.pt", chunks()))
    assert runtime.run(store.get("ckpt/big.pt", start=5, end=9)) == data[5:9]  # gRPC used
    size, generation, pinned, into, streamed, listed = _read_in_a_forked_child(
        store, "ckpt/big.pt", info.generation
    )
    assert (size, generation) == (len(data), info.generation)
    assert pinned == into == streamed == data
    assert listed == [("ckpt/big.pt", len(data), info.generation)]


def test_a_stream_broken_mid_read_is_resumed(emu: Emulator, bucket: str) -> None:
    store = GCSStore(bucket, config=_gcs(emu))
    big = random.Random(7).randbytes(6 << 20)
    emu.seed(bucket, {"big.bin": big})
    emu.reset_stats()
    emu.add_fault("get", "truncate", nth=2)  # the open is 1, its first range 2
    assert runtime.run(store.get("big.bin")) == big
    stats = emu.stats()
    assert stats["faults"] == {"truncate": 1}
    assert stats["by_rpc"]["BidiReadObject"] == 2, stats


def test_shards_pack_and_read_on_a_zonal_bucket(emu: Emulator, bucket: str) -> None:
    pack(
        f"gs://{bucket}/raw/",
        f"gs://{bucket}/packed/",
        config=PackConfig(shard_size=64 * 1024),
        gcs=_gcs(emu),
        progress=False,
    )
    it = BucketShardDataset.from_prefix(f"gs://{bucket}/packed/", gcs=_gcs(emu))
    got = sorted(bytes(s["bin"]) for s in it)
    assert got == sorted(payload(i) for i in range(N))
    m = BucketShardMapDataset.from_prefix(f"gs://{bucket}/packed/", gcs=_gcs(emu))
    assert sorted(bytes(m[i]["bin"]) for i in range(len(m))) == got


def test_checkpoints_save_and_load_and_a_failed_save_keeps_the_old(
    emu: Emulator, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    ck = BucketCheckpoint(config=CheckpointConfig(), gcs=_gcs(emu))
    uri = f"gs://{bucket}/ck/model.pt"
    old = {"w": torch.randn(512, 1024), "step": 1}
    ck.save(old, uri)
    back = ck.load(uri)
    assert torch.equal(back["w"], old["w"]) and back["step"] == 1
    # No multipart upload there is expected, not a warning.
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []
    assert "compose" not in emu.stats()["by_op"]

    class Boom(RuntimeError):
        pass

    with pytest.raises(Boom), ck.writer(uri) as f:
        torch.save({"w": torch.randn(512, 1024)}, f)
        raise Boom
    assert torch.equal(ck.load(uri)["w"], old["w"])
    # A write stream broken at a flush resumes from what the server holds.
    new = {"w": torch.randn(2048, 1024), "step": 2}
    emu.add_fault("put", "truncate")
    ck.save(new, uri)
    assert torch.equal(ck.load(uri)["w"], new["w"])


def test_put_stream_failure_mid_way_leaves_the_object(emu: Emulator, bucket: str) -> None:
    store = GCSStore(bucket, config=_gcs(emu))
    old = random.Random(1).randbytes(5 << 20)

    async def chunks(data: bytes, fail: bool) -> AsyncIterator[bytes]:
        for at in range(0, len(data), 1 << 20):
            if fail and at >= 3 << 20:
                raise RuntimeError("source failed")
            yield data[at : at + (1 << 20)]

    runtime.run(store.put_stream("obj", chunks(old, False)))
    with pytest.raises(RuntimeError):
        runtime.run(store.put_stream("obj", chunks(random.Random(2).randbytes(5 << 20), True)))
    assert runtime.run(store.get("obj")) == old
    listed = runtime.run(store.list_page(""))
    sizes = {o.name: o.size for o in listed.objects if not o.name.startswith("torchbucket-")}
    assert sizes["obj"] == len(old)


def test_a_damaged_write_or_a_killed_save_keeps_the_previous_checkpoint(
    emu: Emulator, bucket: str
) -> None:
    gcs = _gcs(emu)
    ck = BucketCheckpoint(gcs=gcs)
    uri = f"gs://{bucket}/ck/keep.pt"
    old = {"w": torch.randn(1024, 1024)}
    ck.save(old, uri)
    # A chunk damaged in transit is refused by the server: the save ends
    # whole (sent again) or fails leaving the old one, never damaged.
    emu.add_fault("put", "corrupt_request")
    new = {"w": torch.randn(1024, 1024)}
    try:
        ck.save(new, uri)
        old = new
    except StorageError:
        pass
    assert emu.stats()["faults"].get("corrupt_request") == 1
    assert torch.equal(ck.load(uri)["w"], old["w"])
    emu.clear_faults()
    # A save killed mid-stream (SIGKILL): the name still points at the old data.
    saver = (
        "import sys, time; from torchbucket.checkpoint import BucketCheckpoint; "
        "from torchbucket.storage.gcs import GCSConfig; "
        "ck = BucketCheckpoint(gcs=GCSConfig(endpoint=sys.argv[1], grpc_endpoint=sys.argv[2]))\n"
        "with ck.writer(sys.argv[3]) as f:\n"
        "    chunk = bytes(range(256)) * 4096\n"
        "    while f.tell() < 48 << 20: f.write(chunk)\n"
        "    print('UPLOADING', flush=True)\n"
        "    while True: f.write(chunk); time.sleep(0.05)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", saver, gcs.endpoint or "", gcs.grpc_endpoint or "", uri],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "UPLOADING"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert torch.equal(ck.load(uri)["w"], old["w"])
    head = runtime.run(GCSStore(bucket, config=gcs).head("ck/keep.pt"))
    assert head.size > 4 << 20  # the old checkpoint's size, not a partial object's
