"""A checkpoint rewritten while it is loaded: every read path says so the same way."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from torchbucket import runtime
from torchbucket.checkpoint._reader import download, download_range, load_decoded
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.errors import NotFoundError
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.memory import MemoryStore

DATA = bytes(range(256)) * 64
CONFIG = CheckpointConfig()

READS: dict[str, Callable[[ObjectStore, ObjectInfo], object]] = {
    "load_decoded": lambda store, info: load_decoded(store, "ckpt", info),
    "download": lambda store, info: download(
        store, "ckpt", info, memoryview(bytearray(info.size)), CONFIG
    ),
    "download_range": lambda store, info: download_range(
        store, "ckpt", info, memoryview(bytearray(100)), 10, CONFIG
    ),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_rewritten_checkpoint_says_load_it_again(read: str) -> None:
    store = MemoryStore(f"rewritten-{uuid.uuid4().hex[:8]}")
    info = runtime.run(store.put("ckpt", DATA))
    READS[read](store, info)  # the generation read: fine
    runtime.run(store.put("ckpt", DATA))
    with pytest.raises(NotFoundError, match="rewritten while it was read") as caught:
        READS[read](store, info)
    assert f"generation {info.generation}" in str(caught.value)
    assert caught.value.uri == store.uri("ckpt")
    assert isinstance(caught.value.__cause__, NotFoundError)
