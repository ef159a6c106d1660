"""The load buffer: how it is allocated, prefaulted while the download fills it,
and read by ``torch.load`` (``checkpoint/_reader.py``)."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

import pytest
import torch
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint._pages import allocate, prefault
from torchbucket.checkpoint._reader import MemoryFile
from torchbucket.storage import MemoryStore

MiB = 1 << 20


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("ckpt") as name:
        yield name


@pytest.mark.parametrize("size", [0, 1, 4096, MiB, 3 * MiB + 5, 64 * MiB - 1, 64 * MiB + 5])
def test_allocate_gives_a_writable_buffer_of_the_size_asked(size: int) -> None:
    view = allocate(size)
    assert len(view) == size and not view.readonly
    data = random.Random(size).randbytes(size)
    view[:] = data
    assert bytes(view) == data


def test_prefault_keeps_what_the_buffer_holds() -> None:
    view = allocate(65 * MiB + 3)
    data = random.Random(1).randbytes(2 * MiB)
    view[MiB + 1 : 3 * MiB + 1] = data  # part written (not page-aligned), the rest untouched
    prefault(view, MiB, lambda: False)
    assert bytes(view[MiB + 1 : 3 * MiB + 1]) == data
    assert bytes(view[: MiB + 1]) == bytes(MiB + 1)  # fresh pages read as zeros


def test_prefault_of_a_read_only_buffer_does_nothing() -> None:
    data = bytes(range(256)) * 8192
    view = memoryview(data)
    prefault(view, MiB, lambda: False)
    assert view.tobytes() == data


def test_large_reads_into_fresh_tensors_copy_every_byte() -> None:
    data = random.Random(2).randbytes(3 * MiB + 17)
    with MemoryFile("gs://b/k", memoryview(bytearray(data))) as f:
        f.seek(5)
        target = torch.empty(2 * MiB, dtype=torch.uint8)
        assert f.readinto(memoryview(target.numpy())) == 2 * MiB
        assert bytes(target.numpy()) == data[5 : 5 + 2 * MiB]
        rest = bytearray(2 * MiB)
        assert f.readinto(rest) == len(data) - 5 - 2 * MiB
        assert bytes(rest[: len(data) - 5 - 2 * MiB]) == data[5 + 2 * MiB :]


def test_a_multi_range_load_equals_what_was_saved(bucket: str) -> None:
    generator = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(3 * MiB // 4, generator=generator), "b": torch.arange(10)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    runtime.run(MemoryStore(bucket).put("ckpt.pt", buffer.getvalue()))
    config = CheckpointConfig(range_size=MiB // 2, reads_in_flight=3)
    with BucketCheckpoint(config=config).reader(f"memory://{bucket}/ckpt.pt") as f:
        loaded = torch.load(f, weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
