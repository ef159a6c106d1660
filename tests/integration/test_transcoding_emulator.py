"""Objects stored with ``Content-Encoding: gzip`` (GCS's decompressive transcoding).

https://cloud.google.com/storage/docs/transcoding: such an object is served
decompressed, whole (a ``Range`` is ignored), to a client that does not accept
gzip, and as stored to one that does. Every torchbucket read path returns what
``google-cloud-storage``'s ``download_as_bytes()`` returns for it: the decoded
bytes. The objects are written by google-cloud-storage itself, over HTTP, to
the emulator, on the model store and on fake-gcs-server (which transcodes too).
"""

from __future__ import annotations

import gzip
import io
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from torchbucket import BucketCheckpoint, runtime
from torchbucket.cli import main
from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig, collate_list
from torchbucket.emulator import Emulator
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


@pytest.fixture(params=["emulator", "fake_gcs"])
def emu(request: pytest.FixtureRequest) -> Emulator:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def gcs(emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.endpoint)
    return storage.Client(project="test", credentials=AnonymousCredentials())


@pytest.fixture
def bucket(gcs: Any) -> Iterator[Any]:
    """A bucket of plain and gzip-encoded objects, written by google-cloud-storage."""
    b = gcs.create_bucket(f"tc-{uuid.uuid4().hex[:16]}")
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


def test_store_reads_return_what_download_as_bytes_returns(store: GCSStore, bucket: Any) -> None:
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

    assert runtime.run(collect()) == expected
    assert runtime.run(collect(start=123_456, end=200_000)) == expected[123_456:200_000]


def test_a_broken_stream_resumes_within_the_stored_bytes(emu: Emulator, store: GCSStore) -> None:
    emu.add_fault("get", "truncate", match="big.txt", count=2)

    async def collect() -> bytes:
        return b"".join([c async for c in store.stream("big.txt", chunk_size=4096)])

    assert runtime.run(collect()) == BIG
    assert [rule["fired"] for rule in emu.faults()] == [2]


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
    emu: Emulator, bucket: Any, kind: str
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
        # The plain objects of a batch were still composed.
        assert emu.stats()["by_op"].get("compose", 0) > before


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
