"""BucketCheckpoint on the memory store: round trips, aborts, bounded memory, integrity."""

from __future__ import annotations

import asyncio
import gc
import io
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.checkpoint import (
    BucketCheckpoint,
    CheckpointConfig,
    abort_incomplete_uploads,
)
from torchbucket.checkpoint._parts import first_part_size
from torchbucket.checkpoint._reader import load_ranges, split_ranges
from torchbucket.errors import (
    ConfigError,
    DeadlineExceededError,
    IntegrityError,
    InvalidURIError,
    NotFoundError,
    StorageError,
    TransientError,
)
from torchbucket.storage import MemoryStore, ObjectInfo, Part

PART = 64 * 1024
TINY = CheckpointConfig(part_size=PART, min_part_size=1, parts_in_flight=3)


@pytest.fixture
def bucket() -> Any:
    with memory_bucket("ckpt") as name:
        yield name


def state_dict(scale: int = 1) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(scale)
    return {
        "big": torch.randn(300 * scale, 256, generator=generator),  # ~300 KiB per scale
        "small": [torch.arange(i) for i in range(1, 20)],
        "step": 7,
        "name": "model",
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert torch.equal(a["big"], b["big"])
    assert all(torch.equal(x, y) for x, y in zip(a["small"], b["small"], strict=True))
    assert (a["step"], a["name"]) == (b["step"], b["name"])


class RecordingStore:
    """A MemoryStore that counts calls and can hold or fail part uploads."""

    def __init__(self, bucket: str) -> None:
        self.inner = MemoryStore(bucket)
        self.calls: dict[str, int] = {}
        self.in_flight = 0
        self.peak_in_flight = 0
        self.gate: asyncio.Event | None = None
        self.fail_part: int | None = None
        self.parts_seen = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if callable(attr) and name not in ("uri", "bucket"):

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] = self.calls.get(name, 0) + 1
                return attr(*args, **kwargs)

            return counted
        return attr

    def uri(self, key: str = "") -> str:
        return self.inner.uri(key)

    async def multipart_upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: bytes | bytearray | memoryview,
        *,
        crc32c: int | None = None,
    ) -> Part:
        self.calls["multipart_upload_part"] = self.calls.get("multipart_upload_part", 0) + 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            self.parts_seen += 1
            if self.fail_part == number:
                raise TransientError("injected", operation="multipart upload part", uri=key)
            return await self.inner.multipart_upload_part(
                key, upload_id, number, data, crc32c=crc32c
            )
        finally:
            self.in_flight -= 1


def checkpoint_on(store: Any, config: CheckpointConfig = TINY) -> BucketCheckpoint:
    checkpoint = BucketCheckpoint(config=config)
    checkpoint._stores[("memory", store.bucket)] = store
    return checkpoint


def uploads_left(bucket: str) -> list[Any]:
    return runtime.run(MemoryStore(bucket).multipart_list())


def test_round_trip_multipart_with_weights_only(bucket: str) -> None:
    store = RecordingStore(bucket)
    checkpoint = checkpoint_on(store)
    original = state_dict(scale=2)
    uri = f"memory://{bucket}/run/step-1.pt"
    with checkpoint.writer(uri) as f:
        torch.save(original, f)
    assert store.calls["multipart_upload_part"] > 3
    assert "put" not in store.calls
    with checkpoint.reader(uri) as f:
        loaded = torch.load(f, weights_only=True, map_location="cpu")
    assert_same(loaded, original)
    assert uploads_left(bucket) == []


def test_map_location_moves_tensors(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/m.pt"
    checkpoint.save({"w": torch.ones(3, dtype=torch.float64)}, uri)
    loaded = checkpoint.load(uri, weights_only=True, map_location=torch.device("meta"))
    assert loaded["w"].device.type == "meta"


def test_small_checkpoint_is_a_single_put(bucket: str) -> None:
    store = RecordingStore(bucket)
    checkpoint = checkpoint_on(store)
    uri = f"memory://{bucket}/small.pt"
    checkpoint.save({"x": torch.arange(5)}, uri)
    assert store.calls.get("put") == 1
    assert "multipart_initiate" not in store.calls
    assert torch.equal(checkpoint.load(uri, weights_only=True)["x"], torch.arange(5))


def test_empty_file_round_trips(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/empty"
    with checkpoint.writer(uri):
        pass
    with checkpoint.reader(uri) as f:
        assert f.read() == b""


@pytest.mark.parametrize("method", ["multipart", "resumable"])
def test_exception_in_with_block_aborts_and_keeps_previous(bucket: str, method: str) -> None:
    config = CheckpointConfig(part_size=PART, min_part_size=1, upload_method=method)  # type: ignore[arg-type]
    checkpoint = BucketCheckpoint(config=config)
    uri = f"memory://{bucket}/last.pt"
    previous = state_dict(scale=1)
    checkpoint.save(previous, uri)
    with pytest.raises(RuntimeError, match="training blew up"), checkpoint.writer(uri) as f:
        torch.save(state_dict(scale=3), f)
        raise RuntimeError("training blew up")
    assert_same(checkpoint.load(uri, weights_only=True), previous)
    assert uploads_left(bucket) == []
    with pytest.raises(ValueError, match="closed"):
        f.write(b"more")


def test_aborted_new_checkpoint_is_not_visible(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/new.pt"
    writer = checkpoint.writer(uri)
    writer.write(b"x" * (5 * PART))
    writer.abort()
    assert not checkpoint.exists(uri)
    assert uploads_left(bucket) == []


def test_writer_lost_without_close_publishes_nothing(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/lost.pt"
    writer = checkpoint.writer(uri)
    writer.write(b"y" * (4 * PART + 10))
    del writer
    gc.collect()
    # __del__ schedules the abort without waiting for it.
    for _ in range(500):
        if not uploads_left(bucket):
            break
        runtime.run(asyncio.sleep(0.01))
    assert uploads_left(bucket) == []
    assert not checkpoint.exists(uri)


def test_failed_part_fails_the_save_and_leaves_nothing(bucket: str) -> None:
    store = RecordingStore(bucket)
    store.fail_part = 2
    checkpoint = checkpoint_on(store)
    uri = f"memory://{bucket}/fail.pt"
    with pytest.raises(StorageError) as info, checkpoint.writer(uri) as f:
        torch.save(state_dict(scale=2), f)
    assert isinstance(info.value, TransientError)
    assert not checkpoint.exists(uri)
    assert uploads_left(bucket) == []


def test_memory_is_bounded_by_parts_in_flight(bucket: str) -> None:
    store = RecordingStore(bucket)
    gate = runtime.run(_make_event())
    store.gate = gate
    config = CheckpointConfig(part_size=PART, min_part_size=1, parts_in_flight=2)
    checkpoint = checkpoint_on(store, config)
    uri = f"memory://{bucket}/bounded.pt"
    payload = bytes(range(256)) * (20 * PART // 256)
    writer = checkpoint.writer(uri)
    done = threading.Event()

    def save() -> None:
        for offset in range(0, len(payload), 1000):
            writer.write(payload[offset : offset + 1000])
        done.set()

    thread = threading.Thread(target=save)
    thread.start()
    # Wait until both slots are taken; the writer must then stop inside its
    # third buffer, however long we wait.
    while store.in_flight < 2:
        runtime.run(asyncio.sleep(0.01))
    assert not done.wait(0.3)
    assert writer.tell() <= 3 * PART
    assert writer._pool.live <= 3
    runtime.get_loop().call_soon_threadsafe(gate.set)
    thread.join()
    writer.close()
    assert store.peak_in_flight == 2
    assert writer._pool.peak_live <= 3
    assert checkpoint.reader(uri).read() == payload


async def _make_event() -> asyncio.Event:
    return asyncio.Event()


class CorruptingStore(RecordingStore):
    """Assembles the parts in the wrong order, as a buggy server might."""

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        upload = self.inner._upload(key, upload_id, "multipart complete")
        upload.parts[1], upload.parts[2] = upload.parts[2], upload.parts[1]
        swapped = [Part(p.number, crc(upload.parts[p.number])) for p in parts]
        return await self.inner.multipart_complete(key, upload_id, swapped)


def crc(data: bytes) -> str:
    from torchbucket.storage.crc32c import crc32c_b64

    return crc32c_b64(data)


def test_crc_mismatch_raises_and_deletes_the_bad_object(bucket: str) -> None:
    checkpoint = checkpoint_on(CorruptingStore(bucket))
    uri = f"memory://{bucket}/bad.pt"
    with pytest.raises(IntegrityError, match=uri), checkpoint.writer(uri) as f:
        f.write(b"a" * PART + b"b" * PART + b"c")
    assert not checkpoint.exists(uri)


def test_a_save_replaced_before_its_check_leaves_the_other_writers_object(
    tmp_path: Any,
) -> None:
    # The local store answers a completion without a CRC32C, so the save asks
    # the name what it holds: by then another writer's save may hold it.
    from torchbucket.checkpoint import CheckpointWriter
    from torchbucket.storage.local import LocalStore

    other = b"another writer's checkpoint"

    class ReplacedAfterCompletion(LocalStore):
        async def multipart_complete(
            self, key: str, upload_id: str, parts: Sequence[Part]
        ) -> ObjectInfo:
            info = await super().multipart_complete(key, upload_id, parts)
            assert info.crc32c is None
            await self.put(key, other)
            return info

    key = str(tmp_path / "model.pt").lstrip("/")
    with CheckpointWriter(ReplacedAfterCompletion(), key, TINY) as f:
        f.write(b"a" * PART + b"b" * PART + b"c")
    assert f.info is not None and f.info.size == 2 * PART + 1
    assert (tmp_path / "model.pt").read_bytes() == other


def test_missing_checkpoint_is_not_found_with_uri(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/nope.pt"
    with pytest.raises(FileNotFoundError) as info:
        checkpoint.reader(uri)
    assert isinstance(info.value, NotFoundError)
    assert uri in str(info.value)


class RewritingStore(RecordingStore):
    """Rewrites the object after the first range has been read."""

    async def get_into(self, key: str, buffer: memoryview, **kwargs: Any) -> int:
        got = await self.inner.get_into(key, buffer, **kwargs)
        await self.inner.put(key, b"z" * 10)
        return got


def test_rewrite_during_load_fails_instead_of_mixing(bucket: str) -> None:
    config = CheckpointConfig(range_size=PART, reads_in_flight=1)
    checkpoint = checkpoint_on(RewritingStore(bucket), config)
    uri = f"memory://{bucket}/moving.pt"
    runtime.run(MemoryStore(bucket).put("moving.pt", b"q" * (3 * PART)))
    with pytest.raises(NotFoundError, match="rewritten"):
        checkpoint.reader(uri)


def test_corrupt_download_is_detected(bucket: str) -> None:
    class FlippingStore(RecordingStore):
        async def get_into(self, key: str, buffer: memoryview, **kwargs: Any) -> int:
            got = await self.inner.get_into(key, buffer, **kwargs)
            buffer[0] ^= 0xFF
            return got

    checkpoint = checkpoint_on(FlippingStore(bucket))
    runtime.run(MemoryStore(bucket).put("c.pt", b"q" * (2 * PART)))
    with pytest.raises(IntegrityError, match="crc32c"):
        checkpoint.reader(f"memory://{bucket}/c.pt")


def test_writer_is_a_sequential_file(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    with checkpoint.writer(f"memory://{bucket}/f.bin") as f:
        assert f.writable() and not f.seekable() and not f.readable()
        f.write(b"abc")
        f.write(memoryview(b"defg"))
        assert f.tell() == 7
        with pytest.raises(io.UnsupportedOperation):
            f.seek(0)
        f.flush()
    with checkpoint.reader(f"memory://{bucket}/f.bin") as r:
        assert r.read(2) == b"ab"
        r.seek(-2, io.SEEK_END)
        assert r.read() == b"fg"
        r.seek(1)
        target = bytearray(3)
        assert r.readinto(target) == 3 and target == b"bcd"
        assert bytes(r.getbuffer()) == b"abcdefg"
    with pytest.raises(ValueError, match="closed"):
        r.read()


def test_uri_without_object_name_is_rejected() -> None:
    with pytest.raises(InvalidURIError):
        BucketCheckpoint().writer("memory://b/dir/")


def test_abort_incomplete_uploads_by_prefix_and_age(bucket: str) -> None:
    store = MemoryStore(bucket)

    async def scenario() -> tuple[int, int, int]:
        for key in ("run1/a.pt", "run1/b.pt", "run2/c.pt"):
            await store.multipart_initiate(key)
        young = await abort_incomplete_uploads(store, "run1/", older_than=3600)
        first = await abort_incomplete_uploads(store, "run1/")
        left = len(await store.multipart_list())
        return young, first, left

    assert runtime.run(scenario()) == (0, 2, 1)


def test_a_save_aborts_stale_uploads_to_the_same_object(bucket: str) -> None:
    store = MemoryStore(bucket)
    runtime.run(store.multipart_initiate("last.pt"))
    runtime.run(store.multipart_initiate("other.pt"))
    config = CheckpointConfig(part_size=PART, min_part_size=1, stale_upload_age=0)
    BucketCheckpoint(config=config).save({"x": 1}, f"memory://{bucket}/last.pt")
    assert [u.key for u in uploads_left(bucket)] == ["other.pt"]


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="part_size"):
        CheckpointConfig(part_size=1 << 20)  # below the 5 MiB minimum
    with pytest.raises(ConfigError, match="parts_in_flight"):
        CheckpointConfig(parts_in_flight=0)
    with pytest.raises(ConfigError, match="upload_method"):
        CheckpointConfig(upload_method="ftp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="reads_in_flight"):
        CheckpointConfig(reads_in_flight=0)


def test_size_hint_grows_parts_to_fit_the_part_limit() -> None:
    config = CheckpointConfig()
    assert first_part_size(config, None) == config.part_size
    assert first_part_size(config, 10 << 30) == config.part_size
    huge = 5 << 40  # 5 TiB, the largest GCS object
    assert first_part_size(config, huge) * 10_000 >= huge


@given(size=st.integers(0, 10_000), chunk=st.integers(1, 3_000))
def test_split_ranges_tile_the_object(size: int, chunk: int) -> None:
    ranges = split_ranges(size, chunk)
    assert all(0 < hi - lo <= chunk for lo, hi in ranges)
    starts = [lo for lo, _ in ranges]
    assert starts == [0, *(hi for _, hi in ranges[:-1])][: len(ranges)]
    assert (ranges[-1][1] if ranges else 0) == size


@given(size=st.integers(0, 10_000), chunk=st.integers(1, 3_000))
def test_load_ranges_tile_the_object_without_a_sliver_at_the_end(size: int, chunk: int) -> None:
    ranges = load_ranges(size, chunk)
    assert [lo for lo, _ in ranges] == [lo for lo, _ in split_ranges(size, chunk)][: len(ranges)]
    assert all(lo < hi for lo, hi in ranges)
    assert all(hi == lo2 for (_, hi), (lo2, _) in itertools.pairwise(ranges))
    assert (ranges[-1][1] if ranges else 0) == size
    assert all(hi - lo <= chunk + chunk // 8 for lo, hi in ranges)
    if len(ranges) > 1:
        assert ranges[-1][1] - ranges[-1][0] >= chunk // 8
    assert len(ranges) >= len(split_ranges(size, chunk)) - 1


def test_a_load_reads_a_small_tail_with_the_range_before_it(bucket: str) -> None:
    # 3 ranges and 10 bytes: 3 reads, not a 4th for the 10 bytes.
    store = RecordingStore(bucket)
    data = b"r" * (3 * PART + 10)
    runtime.run(store.inner.put("tail.pt", data))
    checkpoint = checkpoint_on(store, CheckpointConfig(range_size=PART))
    with checkpoint.reader(f"memory://{bucket}/tail.pt") as f:
        assert f.read() == data
    assert store.calls.get("get_into", 0) + store.calls.get("get_into_checked", 0) == 3


def test_checkpoint_pickles_without_its_stores(bucket: str) -> None:
    import pickle

    checkpoint = BucketCheckpoint(config=TINY)
    checkpoint.save({"x": 1}, f"memory://{bucket}/p.pt")
    copy = pickle.loads(pickle.dumps(checkpoint))
    assert copy.config == TINY
    assert copy.load(f"memory://{bucket}/p.pt") == {"x": 1}


@pytest.mark.parametrize("completed", [True, False])
def test_a_completion_without_an_answer_is_judged_by_the_object(
    bucket: str, monkeypatch: pytest.MonkeyPatch, completed: bool
) -> None:
    """Answers lost until the deadline: saved if the object holds what was written."""
    ckpt = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/c.pt"
    ckpt.save({"old": torch.zeros(10)}, uri)
    original = MemoryStore.multipart_complete

    async def lost(self: MemoryStore, key: str, upload_id: str, parts: Sequence[Part]) -> Any:
        if completed:
            await original(self, key, upload_id, parts)
        raise DeadlineExceededError("answers lost", operation="multipart complete", uri=uri)

    monkeypatch.setattr(MemoryStore, "multipart_complete", lost)
    new = state_dict(3)
    if completed:
        ckpt.save(new, uri)
    else:
        with pytest.raises(DeadlineExceededError):
            ckpt.save(new, uri)
    monkeypatch.undo()
    got = ckpt.load(uri, weights_only=True)
    assert ("old" not in got) == completed
    store, _ = ckpt.open(uri)
    assert runtime.run(store.multipart_list("")) == []


# -- load() through a memfd mapped by torch.load ------------------------------


@pytest.mark.parametrize("mmap", [None, False, True])
def test_load_gives_writable_tensors_equal_to_the_saved_ones(
    bucket: str, mmap: bool | None
) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/mapped.pt"
    original = state_dict(scale=2)
    checkpoint.save(original, uri)
    kwargs = {} if mmap is None else {"mmap": mmap}
    loaded = checkpoint.load(uri, weights_only=True, **kwargs)
    assert_same(loaded, original)
    # Written in place, a loaded tensor changes alone: neither the saved object
    # nor a second load sees it.
    loaded["big"].add_(1.0)
    assert torch.equal(loaded["big"], original["big"] + 1.0)
    assert_same(checkpoint.load(uri, weights_only=True), original)


def test_load_leaves_no_file_descriptor_open(bucket: str) -> None:
    import os

    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/fds.pt"
    checkpoint.save(state_dict(), uri)
    checkpoint.load(uri, weights_only=True)  # opens the store
    before = len(os.listdir("/proc/self/fd"))
    loaded = [checkpoint.load(uri, weights_only=True, mmap=True) for _ in range(5)]
    assert len(os.listdir("/proc/self/fd")) == before
    assert_same(loaded[-1], state_dict())


def test_load_reads_the_legacy_format(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=TINY)
    uri = f"memory://{bucket}/legacy.pt"
    with checkpoint.writer(uri) as f:
        torch.save({"x": torch.arange(6)}, f, _use_new_zipfile_serialization=False)
    for mmap in (False, True):
        assert torch.equal(checkpoint.load(uri, weights_only=True, mmap=mmap)["x"], torch.arange(6))


def test_load_of_a_missing_checkpoint_is_not_found(bucket: str) -> None:
    with pytest.raises(NotFoundError):
        BucketCheckpoint(config=TINY).load(
            f"memory://{bucket}/absent.pt", weights_only=True, mmap=True
        )
