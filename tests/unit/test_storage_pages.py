"""``storage.pages``: every page of a plain listing, hidden names included."""

from __future__ import annotations

import uuid

from torchbucket import runtime
from torchbucket.storage.base import HIDDEN_PREFIXES
from torchbucket.storage.memory import MemoryStore, delete_memory_bucket
from torchbucket.storage.pages import list_all, list_pages


def test_every_page_is_followed_in_order() -> None:
    name = f"pages-{uuid.uuid4().hex[:8]}"
    store = MemoryStore(name)
    try:
        names = [f"p/{i:05d}" for i in range(2500)] + ["q/other"]
        for key in names:
            runtime.run(store.put(key, b"x"))

        async def pages() -> list[int]:
            return [len(page.objects) async for page in list_pages(store, "p/")]

        assert runtime.run(pages()) == [1000, 1000, 500]  # the store's page size
        assert [o.name for o in runtime.run(list_all(store, "p/"))] == names[:-1]
        assert runtime.run(list_all(store, "none/")) == []
    finally:
        delete_memory_bucket(name)


def test_hidden_names_are_listed() -> None:
    name = f"pages-{uuid.uuid4().hex[:8]}"
    store = MemoryStore(name)
    try:
        hidden = HIDDEN_PREFIXES[0] + "group-1"
        runtime.run(store.put(hidden, b"composite"))
        assert [o.name for o in runtime.run(list_all(store, HIDDEN_PREFIXES[0]))] == [hidden]
    finally:
        delete_memory_bucket(name)
