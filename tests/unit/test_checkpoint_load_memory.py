"""A checkpoint load holds the checkpoint once: the download shrinks as torch.load copies it out."""

from __future__ import annotations

import gc
import io
import threading
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
import torch
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.checkpoint._consumed import record_ranges, supported
from torchbucket.storage import MemoryStore

MiB = 1 << 20

linux_only = pytest.mark.skipif(not supported(), reason="pages are given back only on Linux")


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("ckpt") as name:
        yield name


def state_dict(total: int) -> dict[str, torch.Tensor]:
    """Four large tensors and many small ones, about ``total`` bytes."""
    g = torch.Generator().manual_seed(5)
    out = {f"large.{i}": torch.randn(total // 5 // 4, generator=g) for i in range(4)}
    for i in range(200):
        out[f"small.{i}"] = torch.randn(total // 5 // 4 // 200, generator=g)
    return out


def save(bucket: str, state: dict[str, Any]) -> tuple[str, bytes]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    runtime.run(MemoryStore(bucket).put("ckpt.pt", data))
    return f"memory://{bucket}/ckpt.pt", data


def extra_rss(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and how far this process's RSS rose above its start during it (5 ms samples)."""
    process = psutil.Process()
    gc.collect()
    baseline = process.memory_info().rss
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            done.wait(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    peak[0] = max(peak[0], process.memory_info().rss)
    return result, peak[0] - baseline


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@linux_only
@pytest.mark.parametrize("how", ["reader", "load"])
def test_a_load_needs_the_checkpoint_once_not_twice(bucket: str, how: str) -> None:
    original = state_dict(160 * MiB)
    uri, data = save(bucket, original)
    checkpoint = BucketCheckpoint()

    def load() -> dict[str, torch.Tensor]:
        if how == "load":
            return checkpoint.load(uri, weights_only=True)  # type: ignore[no-any-return]
        with checkpoint.reader(uri) as f:
            return torch.load(f, weights_only=True)  # type: ignore[no-any-return]

    loaded, extra = extra_rss(load)
    assert_equal(loaded, original)
    # The tensors alone are 1.0; the download held beside them was 2.0.
    assert extra / len(data) < 1.4


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_dcp_load_holds_little_beside_the_state_dict_it_loads_into(bucket: str) -> None:
    import torch.distributed.checkpoint as dcp

    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter

    original = state_dict(240 * MiB)
    uri = f"memory://{bucket}/dcp"
    dcp.save(original, storage_writer=BucketStorageWriter(uri), no_dist=True)
    target = {name: torch.zeros_like(t) for name, t in original.items()}
    size = sum(t.nbytes for t in target.values())
    _, extra = extra_rss(
        lambda: dcp.load(target, storage_reader=BucketStorageReader(uri), no_dist=True)
    )
    assert_equal(target, original)
    # Unbounded, the download ran ahead of the loading and held nearly all of it.
    assert extra / size < 0.4


def test_bytes_read_again_after_torch_load_are_the_checkpoints(bucket: str) -> None:
    original = state_dict(80 * MiB)
    uri, data = save(bucket, original)
    with BucketCheckpoint().reader(uri) as f:
        assert_equal(torch.load(f, weights_only=True), original)
        f.seek(0)
        assert_equal(torch.load(f, weights_only=True), original)
        f.seek(0)
        assert f.read() == data
        assert bytes(f.getbuffer()) == data


def test_a_read_across_bytes_already_handed_to_torch_load_gets_them_again(bucket: str) -> None:
    original = state_dict(80 * MiB)
    uri, data = save(bucket, original)
    with BucketCheckpoint().reader(uri) as f:
        torch.load(f, weights_only=True)
        first, end = max(record_ranges(memoryview(data)), key=lambda r: r[1] - r[0])
        start = max(0, first - 100)
        f.seek(start)
        target = bytearray(end - start + 50)
        count = f.readinto(target)
        assert bytes(target[:count]) == data[start : start + count]


def test_record_ranges_are_where_each_records_bytes_lie() -> None:
    buffer = io.BytesIO()
    torch.save({"a": torch.arange(1000), "b": torch.ones(3, 5), "c": torch.empty(0)}, buffer)
    data = buffer.getvalue()
    ranges = record_ranges(memoryview(data))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = [archive.read(info) for info in archive.infolist() if info.file_size]
    assert sorted(data[start:end] for start, end in ranges) == sorted(members)


def test_record_ranges_of_what_is_not_a_zip_file_are_none() -> None:
    buffer = io.BytesIO()
    torch.save({"a": torch.arange(10)}, buffer, _use_new_zipfile_serialization=False)
    assert record_ranges(memoryview(buffer.getvalue())) == []
    assert record_ranges(memoryview(b"PK\x03\x04 but no central directory")) == []
