"""Objects stored with ``Content-Encoding: gzip`` (GCS's decompressive transcoding).

https://cloud.google.com/storage/docs/transcoding: such an object is served
decompressed, whole (a ``Range`` is ignored), to a client that does not accept
gzip, and as stored to one that does. Every torchbucket read path returns what
``google-cloud-storage``'s ``download_as_bytes()`` returns for it: the decoded
bytes. The objects are written by google-cloud-storage itself, over HTTP, to
the emulator, on the model store and on fake-gcs-server (which transcodes too).

On a zonal bucket (``tests/bucket_kinds.py``) torchbucket reads over gRPC,
which GCS does not transcode: it serves the stored bytes
(:func:`test_grpc_serves_the_stored_bytes_as_gcs_does`), and torchbucket
decodes them (``storage/gcs/_zonal_gzip.py``), so every read returns the same
bytes as on a regional bucket. fake-gcs-server has no zonal bucket: its cases
are regional only.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import bucket_kinds
from torchbucket import BucketCheckpoint, accounting, runtime
from torchbucket.cli import main
from torchbucket.compose import ComposeConfig
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig, collate_list
from torchbucket.emulator import Emulator
from torchbucket.errors import NotFoundError, StorageError
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator

EMULATOR_RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)

storage = pytest.importorskip("google.cloud.storage")

# Bigger than the in-place reader's threshold (1 MiB) once decoded, and than
# the stored form, so a range of the stored bytes would be no range of these.
BIG = b"".join(b"line %07d of a text that compresses well\n" % i for i in range(60_000))


def plain(i: int) -> bytes:
    return b"object %d " % i * (50 + i)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The model store on the bucket kinds ``bucket_kinds.py`` gives, and fake-gcs-server."""
    if "server" in metafunc.fixturenames:
        kinds = bucket_kinds.kinds_for(metafunc.definition.nodeid, ["emulator"]) or ["regional"]
        cases = [(kind, "model") for kind in kinds] + [("regional", "fake_gcs")]
        ids = [kind if server == "model" else server for kind, server in cases]
        metafunc.parametrize(("bucket_kind", "server"), cases, ids=ids)


@pytest.fixture
def emu(request: pytest.FixtureRequest, bucket_kind: str, server: str) -> Emulator:
    name = "emulator" if server == "model" else "fake_gcs"  # ``emulator`` reads bucket_kind
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.fixture
def gcs(emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.endpoint)
    return storage.Client(project="test", credentials=AnonymousCredentials())


@pytest.fixture
def bucket(emu: Emulator, gcs: Any) -> Iterator[Any]:
    """A bucket of plain and gzip-encoded objects, written by google-cloud-storage."""
    name = f"tc-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)  # a zonal one for bucket_kind "zonal"
    b = gcs.bucket(name)
    for i in range(12):
        blob = b.blob(f"train/{i:03d}")
        if i % 3 == 0:
            blob.content_encoding = "gzip"
            blob.upload_from_string(gzip.compress(plain(i)), content_type="text/plain")
        else:
            blob.upload_from_string(plain(i))
    big = b.blob("big.txt")
    big.content_encoding = "gzip"
    big.upload_from_string(gzip.compress(BIG), content_type="text/plain")
    yield b


@pytest.fixture
def store(emu: Emulator, bucket: Any) -> Iterator[GCSStore]:
    s = GCSStore(
        bucket.name,
        config=GCSConfig(endpoint=emu.endpoint, anonymous=True, retry=EMULATOR_RETRY),
    )
    yield s
    runtime.run(s.close())


def test_the_emulator_transcodes_as_gcs_documents(
    emu: Emulator, bucket: Any, raw_http: Callable[..., Any]
) -> None:
    path = f"/storage/v1/b/{bucket.name}/o/big.txt?alt=media"
    meta = raw_http(emu, "GET", f"/storage/v1/b/{bucket.name}/o/big.txt").json()
    assert meta["contentEncoding"] == "gzip"
    assert int(meta["size"]) < len(BIG)
    # No Accept-Encoding: gzip (http.client sends "identity"): decoded, whole,
    # the Range ignored, no Content-Length, the stored bytes' hashes.
    reply = raw_http(emu, "GET", path, headers={"Range": "bytes=10-19"})
    assert reply.status == 200
    assert reply.body == BIG
    assert reply.headers["x-goog-stored-content-encoding"] == "gzip"
    if emu.backend == "model":  # fake-gcs-server sends one
        assert "Content-Length" not in reply.headers
    assert "Content-Encoding" not in reply.headers
    assert f"crc32c={meta['crc32c']}" in reply.headers["x-goog-hash"]
    # With Accept-Encoding: gzip: the stored bytes, a Range over them.
    reply = raw_http(emu, "GET", path, headers={"Accept-Encoding": "gzip", "Range": "bytes=10-19"})
    assert reply.status == 206
    assert reply.headers["Content-Encoding"] == "gzip"
    assert reply.headers["Content-Range"] == f"bytes 10-19/{meta['size']}"
    assert len(reply.body) == 10
    whole = raw_http(emu, "GET", path, headers={"Accept-Encoding": "gzip"})
    assert whole.status == 200 and len(whole.body) == int(meta["size"])
    assert gzip.decompress(whole.body) == BIG


def test_store_reads_return_what_download_as_bytes_returns(
    emu: Emulator, bucket_kind: str, store: GCSStore, bucket: Any
) -> None:
    streams = emu.stats().get("by_rpc", {}).get("BidiReadObject", 0)
    expected = bucket.blob("big.txt").download_as_bytes()
    assert expected == BIG
    info = runtime.run(store.head("big.txt"))
    assert info.content_encoding == "gzip"
    assert info.transcoded
    listed = runtime.run(store.list_page("big"))
    assert [o.content_encoding for o in listed.objects] == ["gzip"]
    assert runtime.run(store.get("big.txt")) == expected
    # Offsets are offsets into the decoded bytes, also past the stored size.
    for start, end in [(5, 70), (info.size - 3, info.size + 4000), (len(BIG) - 10, None)]:
        assert runtime.run(store.get("big.txt", start=start, end=end)) == expected[start:end]
    assert runtime.run(store.get("big.txt", start=len(BIG) + 5)) == b""
    # In place, a range longer than the in-place reader's threshold.
    buffer = bytearray(len(BIG) - 1000)
    got = runtime.run(store.get_into("big.txt", memoryview(buffer), start=1000))
    assert got == len(buffer) and bytes(buffer) == expected[1000:]

    async def collect(**kw: Any) -> bytes:
        return b"".join([c async for c in store.stream("big.txt", chunk_size=4096, **kw)])

    # GCS has no CRC32C of the decoded bytes: a checked read says it has none.
    head = bytearray(info.size)
    got, crc = runtime.run(store.get_into_checked("big.txt", memoryview(head)))
    assert (got, crc) == (info.size, None) and bytes(head) == expected[: info.size]
    # Pinned to the generation listed, a range too; a generation gone is not found.
    pinned = runtime.run(store.get("big.txt", start=9, end=99, generation=info.generation))
    assert pinned == expected[9:99]
    with pytest.raises(NotFoundError):
        runtime.run(store.get("big.txt", start=9, generation=info.generation + 1))
    assert runtime.run(collect()) == expected
    assert runtime.run(collect(start=123_456, end=200_000)) == expected[123_456:200_000]
    # A stream from past the stored size goes on in the decoded bytes, as a get does.
    past = info.size + 100
    assert runtime.run(collect(start=past)) == expected[past:] != b""
    # On a zonal bucket all of it went over gRPC, which serves the stored bytes.
    now = emu.stats().get("by_rpc", {}).get("BidiReadObject", 0)
    assert (now > streams) == (bucket_kind == "zonal")


def test_grpc_serves_the_stored_bytes_as_gcs_does(
    grpc_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GCS's gRPC API does not transcode (storage/gcs/_zonal_gzip.py): the
    # official client's reads of a gzip-encoded object on a zonal bucket get
    # its stored bytes, ranges over them, checked against their CRC32C.
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient
    from google.cloud.storage.asyncio.async_multi_range_downloader import (
        AsyncMultiRangeDownloader,
    )

    emu = grpc_emulator
    name = f"tc-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name, zonal=True)
    stored = gzip.compress(BIG)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.endpoint)
    gcs = storage.Client(project="test", credentials=AnonymousCredentials())
    blob = gcs.bucket(name).blob("big.txt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(stored, content_type="text/plain")

    async def body() -> tuple[int, list[bytes]]:
        client = AsyncGrpcClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=emu.grpc_endpoint),
        )
        mrd = await AsyncMultiRangeDownloader.create_mrd(client, name, "big.txt")
        bufs = [io.BytesIO(), io.BytesIO()]
        await mrd.download_ranges([(10, 10, bufs[0]), (0, 0, bufs[1])])
        await mrd.close()
        return mrd.persisted_size, [b.getvalue() for b in bufs]

    size, got = asyncio.run(body())
    assert size == len(stored) < len(BIG)
    assert got == [stored[10:20], stored]


def test_a_broken_stream_resumes_within_the_stored_bytes(emu: Emulator, store: GCSStore) -> None:
    emu.add_fault("get", "truncate", match="big.txt", count=2)

    async def collect() -> bytes:
        return b"".join([c async for c in store.stream("big.txt", chunk_size=4096)])

    assert runtime.run(collect()) == BIG
    assert [rule["fired"] for rule in emu.faults()] == [2]


def test_a_stalled_read_of_a_gzip_object_completes_through_its_hedge(
    emu: Emulator, bucket: Any
) -> None:
    # One attempt: only the hedge can rescue the read (on a zonal bucket a
    # hedge's chunks replace the stalled stream's in what is decoded).
    hedge = HedgeConfig(budget=1.0, burst=1.0, initial_wait=0.2, floor=0.2, min_samples=4)
    retry = RetryConfig(
        initial_backoff=0.01, max_backoff=0.05, deadline=60.0, read_timeout=60.0, max_attempts=1
    )
    config = GCSConfig(endpoint=emu.endpoint, anonymous=True, retry=retry, hedge=hedge)
    s = GCSStore(bucket.name, config=config)
    try:
        for _ in range(4):  # the reads of this size the wait is learnt from
            assert runtime.run(s.get("big.txt")) == BIG
        emu.add_fault("get", "stall", match="big.txt", stall_seconds=30.0)
        before = accounting.snapshot()
        assert runtime.run(s.get("big.txt")) == BIG
        assert (accounting.snapshot() - before).hedges == 1
    finally:
        runtime.run(s.close())


def test_an_object_that_does_not_decode_is_an_error_naming_it(store: GCSStore, bucket: Any) -> None:
    blob = bucket.blob("bad.txt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(b"not gzip at all " * 100, content_type="text/plain")

    async def collect() -> bytes:
        return b"".join([c async for c in store.stream("bad.txt", start=5)])

    for read in (lambda: store.get("bad.txt"), lambda: store.get("bad.txt", start=5), collect):
        with pytest.raises(StorageError, match="do not decode") as caught:
            runtime.run(read())
        assert caught.value.uri == f"gs://{bucket.name}/bad.txt"


def test_compose_of_gzip_objects_is_what_gcs_composes(store: GCSStore, bucket: Any) -> None:
    # The composite gets no contentEncoding (only the destination resource
    # sets one): it holds the stored gzip members back to back, served as is.
    names = [f"train/{i:03d}" for i in (0, 3)]
    stored = b"".join(bucket.blob(n).download_as_bytes(raw_download=True) for n in names)
    composite = runtime.run(store.compose("both", [runtime.run(store.head(n)) for n in names]))
    assert composite.content_encoding is None
    got = runtime.run(store.get("both"))
    assert got == stored == bucket.blob("both").download_as_bytes()
    assert gzip.decompress(got) == plain(0) + plain(3)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_datasets_with_compose_return_decoded_objects(
    emu: Emulator, bucket_kind: str, bucket: Any, kind: str
) -> None:
    expected = {
        f"train/{i:03d}": bucket.blob(f"train/{i:03d}").download_as_bytes() for i in range(12)
    }
    assert all(expected[f"train/{i:03d}"] == plain(i) for i in range(12))
    config = GCSConfig(endpoint=emu.endpoint, anonymous=True, retry=EMULATOR_RETRY)
    compose = ComposeConfig(max_composite_object_size=1 << 20)
    uri = f"gs://{bucket.name}/train/"
    before = emu.stats()["by_op"].get("compose", 0)
    ds: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(uri, gcs=config, compose=compose)
        loader = DataLoader(ds, batch_size=12, collate_fn=list)
    else:
        ds = BucketIterableDataset.from_prefix(uri, gcs=config, compose=compose)
        loader = DataLoader(ds, batch_size=12, collate_fn=list)
    seen = [sample for batch in loader for sample in batch]
    assert sorted(seen) == sorted(expected.values())
    if kind == "map":
        assert [ds[i] for i in range(12)] == [plain(i) for i in range(12)]
        # The plain objects of a batch were still composed; a zonal bucket
        # has no compose, and none was asked.
        composed = emu.stats()["by_op"].get("compose", 0) - before
        assert composed > 0 if bucket_kind == "regional" else composed == 0


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_tensor_output_of_gzip_objects_in_workers_is_the_decoded_bytes(
    emu: Emulator, bucket: Any, kind: str
) -> None:
    # In a DataLoader worker, objects read one by one are carved out of shared
    # segments sized by their listed (stored) sizes; a gzip object decodes to
    # more than that and gets a tensor of its own.
    config = GCSConfig(endpoint=emu.endpoint, anonymous=True, retry=EMULATOR_RETRY)
    uri = f"gs://{bucket.name}/train/"
    fetch = FetchConfig(output="tensor")
    off = ComposeConfig(enabled=False)
    ds: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(uri, gcs=config, compose=off, fetch=fetch)
    else:
        ds = BucketIterableDataset.from_prefix(uri, gcs=config, compose=off, fetch=fetch)
    loader = DataLoader(ds, batch_size=12, num_workers=1, collate_fn=collate_list)
    seen = [bytes(sample.numpy()) for batch in loader for sample in batch]
    assert sorted(seen) == sorted(plain(i) for i in range(12))


def test_cp_downloads_decoded_bytes(emu: Emulator, bucket: Any, tmp_path: Path) -> None:
    argv = ["--endpoint", emu.endpoint, "--deadline", "20", "cp"]
    for threshold in ("64MiB", "64KiB"):  # whole reads, then streamed ones
        dst = tmp_path / threshold
        assert main([*argv, "--stream-threshold", threshold, f"gs://{bucket.name}/", str(dst)]) == 0
        assert (dst / "big.txt").read_bytes() == bucket.blob("big.txt").download_as_bytes()
        assert (dst / "train" / "000").read_bytes() == plain(0)


def test_checkpoint_loads_decoded_bytes(emu: Emulator, bucket: Any) -> None:
    state = {"w": torch.arange(300_000, dtype=torch.float32), "step": 7}
    raw = io.BytesIO()
    torch.save(state, raw)
    blob = bucket.blob("ckpt/model.pt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(raw.getvalue()))
    ckpt = BucketCheckpoint(
        gcs=GCSConfig(endpoint=emu.endpoint, anonymous=True, retry=EMULATOR_RETRY)
    )
    uri = f"gs://{bucket.name}/ckpt/model.pt"
    with ckpt.reader(uri) as f:
        assert bytes(f.read()) == blob.download_as_bytes() == raw.getvalue()
    for kwargs in ({}, {"mmap": True}):
        loaded = ckpt.load(uri, weights_only=True, **kwargs)
        assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
