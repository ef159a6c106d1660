"""Reading an object as listed: one message for "rewritten since listed", on every read path.

``storage.listed`` owns the rule (``as_listed``, ``check_listed_size``); the
plain read (``read_verified``) and the dataset's reads into a buffer, whole or
in ranges (``datasets._receive.read_object``), say the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.datasets._receive import read_object
from torchbucket.datasets.config import FetchConfig
from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.listed import read_verified
from torchbucket.storage.memory import MemoryStore

SMALL = b"x" * 1000
LARGE = bytes(range(256)) * (64 * 1024)  # 16 MiB: read in ranges by default

Read = Callable[[ObjectStore, ObjectInfo], Coroutine[Any, Any, Any]]
READS: dict[str, Read] = {
    "read_verified": read_verified,
    "bytes": lambda store, info: read_object(store, info, FetchConfig(output="bytes")),
    "tensor": lambda store, info: read_object(store, info, FetchConfig(output="tensor")),
}


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(f"listed-{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("data", [SMALL, LARGE], ids=["whole", "ranged"])
@pytest.mark.parametrize("read", sorted(READS))
def test_a_rewritten_object_says_so(store: MemoryStore, read: str, data: bytes) -> None:
    listed = runtime.run(store.put("obj", data))
    runtime.run(store.put("obj", data))  # a new generation
    with pytest.raises(NotFoundError, match="rewritten since it was listed") as caught:
        runtime.run(READS[read](store, listed))
    assert caught.value.uri == store.uri("obj")
    assert isinstance(caught.value.__cause__, NotFoundError)


@pytest.mark.parametrize("read", sorted(READS))
def test_an_object_of_another_size_says_so(store: MemoryStore, read: str) -> None:
    info = runtime.run(store.put("obj", SMALL))
    wrong = ObjectInfo(info.name, info.size + 1, info.generation, None)
    with pytest.raises(IntegrityError, match="listed with 1001"):
        runtime.run(READS[read](store, wrong))


@pytest.mark.parametrize("read", sorted(READS))
def test_without_a_generation_a_missing_object_is_plainly_missing(
    store: MemoryStore, read: str
) -> None:
    with pytest.raises(NotFoundError) as caught:
        runtime.run(READS[read](store, ObjectInfo("gone", 10)))
    assert "since it was listed" not in str(caught.value)
