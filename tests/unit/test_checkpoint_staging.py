"""A multipart save on a store that cannot check what it assembles (GCS) is staged.

The store here is the memory store told that it assembles unchecked, as GCS
does, and made to assemble damaged bytes on demand: the one failure a server
cannot refuse (each part was checked on arrival; the completion carries no
hash). The previous checkpoint must survive such a save, unchanged.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator, Sequence

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import CheckpointConfig, CheckpointWriter
from torchbucket.compose.registry import in_flight
from torchbucket.errors import IntegrityError
from torchbucket.storage.base import ObjectInfo, Part
from torchbucket.storage.memory import MemoryStore

KEY = "run/ckpt.pt"


class UncheckedAssembly(MemoryStore):
    """A memory store that, like GCS, does not check an assembled object."""

    unchecked_multipart_assembly = True

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.damage_assembly = False

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        info = await super().multipart_complete(key, upload_id, parts)
        if not self.damage_assembly:
            return info
        data = bytearray(await self.get(key))
        data[len(data) // 2] ^= 0xFF
        return await self.put(key, bytes(data))


@pytest.fixture
def store() -> Iterator[UncheckedAssembly]:
    yield UncheckedAssembly(f"staging-{uuid.uuid4().hex[:8]}")


CONFIG = CheckpointConfig(part_size=64 * 1024, min_part_size=1024, parts_in_flight=4)


def save(store: MemoryStore, state: dict[str, torch.Tensor]) -> ObjectInfo:
    with CheckpointWriter(store, KEY, CONFIG) as writer:
        torch.save(state, writer)
    assert writer.info is not None
    return writer.info


def load(store: MemoryStore) -> dict[str, torch.Tensor]:
    data = runtime.run(store.get(KEY))
    return torch.load(io.BytesIO(data), weights_only=True)  # type: ignore[no-any-return]


def names(store: MemoryStore) -> list[str]:
    page = runtime.run(store.list_page(""))
    return [o.name for o in page.objects]


def state(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(300, 256, generator=torch.Generator().manual_seed(seed))}


def test_a_staged_save_leaves_only_the_checkpoint(store: UncheckedAssembly) -> None:
    info = save(store, state(1))
    assert info.name == KEY
    assert torch.equal(load(store)["w"], state(1)["w"])
    assert names(store) == [KEY]
    assert runtime.run(store.multipart_list("")) == []
    assert not [u for u in in_flight() if u.startswith(store.uri())]


def test_a_damaged_assembly_never_replaces_the_previous_checkpoint(
    store: UncheckedAssembly,
) -> None:
    save(store, state(1))
    before = runtime.run(store.head(KEY))
    store.damage_assembly = True
    with pytest.raises(IntegrityError) as caught:
        save(store, state(2))
    # Named after the checkpoint, and raised after the writer's clean-up.
    assert store.uri(KEY) in str(caught.value)
    assert "not replaced" in str(caught.value)
    assert runtime.run(store.head(KEY)).generation == before.generation
    assert torch.equal(load(store)["w"], state(1)["w"])
    assert names(store) == [KEY]
    assert runtime.run(store.multipart_list("")) == []
    assert not [u for u in in_flight() if u.startswith(store.uri())]
