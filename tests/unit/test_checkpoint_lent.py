"""``BucketCheckpoint.save`` uploads parts straight out of the tensors it saves (issue 45).

The writer copies what ``torch.save`` writes into part buffers, except the
bytes of the CPU tensors ``save`` found in the object: a part is gathered from
views of the tensors' own memory and the copied bytes between them
(``checkpoint/_gather.py``). These tests hold that to what a save
guaranteed: the bytes saved are the tensors' (whatever the part boundaries,
shared or non-contiguous storages, nested containers), what is not a tensor of
the object is still copied, and a tensor changed while its parts upload fails
the save instead of storing a torn checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from memory_helper import memory_bucket

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint._lent import collect
from torchbucket.errors import IntegrityError
from torchbucket.storage import MemoryStore
from torchbucket.storage.base import PartData, part_pieces

PART = 64 * 1024
CONFIG = CheckpointConfig(part_size=PART, min_part_size=1, parts_in_flight=4)


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("lent") as name:
        yield name


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class RecordingStore:
    """A MemoryStore that records where each part's bytes were, and can act before reading them."""

    def __init__(self, bucket: str) -> None:
        self.inner = MemoryStore(bucket)
        self.bucket = bucket
        #: Per part, where each of its pieces was (address, size).
        self.parts: list[list[tuple[int, int]]] = []
        self.before_part: Any = None

    @property
    def pieces(self) -> list[tuple[int, int]]:
        return [piece for part in self.parts for piece in part]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def uri(self, key: str = "") -> str:
        return self.inner.uri(key)

    async def multipart_upload_part(
        self, key: str, upload_id: str, number: int, data: PartData, *, crc32c: int | None = None
    ) -> Any:
        self.parts.append([(address(p), len(p)) for p in part_pieces(data) if len(p)])
        if self.before_part is not None:
            self.before_part(number)
        await asyncio.sleep(0)
        return await self.inner.multipart_upload_part(key, upload_id, number, data, crc32c=crc32c)


def on(store: RecordingStore) -> BucketCheckpoint:
    checkpoint = BucketCheckpoint(config=CONFIG)
    checkpoint._stores[("memory", store.bucket)] = store
    return checkpoint


def state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(5)
    big = torch.randn(300_001, generator=g)  # not a whole number of parts
    return {
        "model": {"big": big, "half": torch.randn(70_000, generator=g).to(torch.bfloat16)},
        "views": [big[::3], big[1000:2000]],  # the same storage again, non-contiguous
        "small": [torch.arange(i) for i in range(50)],
        "step": 7,
    }


def inside(part: tuple[int, int], tensor: torch.Tensor) -> bool:
    storage = tensor.untyped_storage()
    start, size = part
    return storage.data_ptr() <= start and start + size <= storage.data_ptr() + storage.nbytes()


def test_the_tensors_are_sent_from_their_own_memory_and_the_bytes_are_theirs(
    bucket: str,
) -> None:
    store = RecordingStore(bucket)
    uri = f"memory://{bucket}/c.pt"
    saved = state()
    on(store).save(saved, uri)
    loaded = on(store).load(uri, weights_only=True)
    for name in ("big", "half"):
        assert torch.equal(loaded["model"][name], saved["model"][name])
    assert torch.equal(loaded["views"][0], saved["model"]["big"][::3])
    assert torch.equal(loaded["views"][1], saved["model"]["big"][1000:2000])
    assert all(torch.equal(a, b) for a, b in zip(loaded["small"], saved["small"], strict=True))
    tensors = (saved["model"]["big"], saved["model"]["half"])
    for tensor in tensors:  # every byte of theirs, none copied, whatever the part boundaries
        lent = [size for piece in store.pieces if inside(piece, tensor) for size in [piece[1]]]
        assert sum(lent) == tensor.untyped_storage().nbytes()
    copied = [p for p in store.pieces if not any(inside(p, t) for t in tensors)]
    assert copied  # the pickle and the small tensors went through part buffers
    assert any(len(part) > 1 for part in store.parts)  # parts gathered from both


def test_the_writer_alone_copies_everything(bucket: str) -> None:
    store = RecordingStore(bucket)
    uri = f"memory://{bucket}/w.pt"
    saved = state()
    with on(store).writer(uri) as f:
        torch.save(saved, f)
    assert not any(inside(p, saved["model"]["big"]) for p in store.pieces)


def test_a_tensor_changed_while_its_parts_upload_fails_the_save(bucket: str) -> None:
    store = RecordingStore(bucket)
    checkpoint = on(store)
    uri = f"memory://{bucket}/moving.pt"
    checkpoint.save({"w": torch.zeros(4)}, uri)
    saved = state()
    big = saved["model"]["big"]

    def train(number: int) -> None:
        if number == 6:
            big.add_(1.0)  # another thread training on while the save runs

    store.before_part = train
    # The part's CRC32C was taken at the write and the part declares it: the
    # store refuses the changed bytes (GCS answers 400), the save fails and
    # the previous checkpoint is still the one that loads.
    with pytest.raises(IntegrityError, match=r"part \d+ declares CRC32C") as info:
        checkpoint.save(saved, uri)
    assert uri in str(info.value)
    store.before_part = None
    assert torch.equal(checkpoint.load(uri, weights_only=True)["w"], torch.zeros(4))


def test_collect_finds_cpu_tensors_in_nested_containers_once() -> None:
    t = torch.arange(10, dtype=torch.float32)
    memory = collect({"a": [t, (t[2:], {"b": torch.ones(3)})], "n": 3, "s": "x"})
    assert memory.holds(memoryview(t.numpy()).cast("B"))
    assert not memory.holds(memoryview(bytearray(8)))
    assert not collect({"x": 1, "e": torch.empty(0)})
