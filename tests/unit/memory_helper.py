"""A bucket of the in-memory store for one test: a fresh name, seeded, forgotten after.

The unit tests' fixtures are all the same few lines: a unique name with a
tag saying which test file made it, objects put into it, the name yielded,
and the bucket deleted afterwards (the memory store's buckets live as long as
the process, so a bucket left behind would be seen by the next test that
lists its name). ``memory_bucket`` is those lines once::

    @pytest.fixture
    def bucket() -> Iterator[str]:
        with memory_bucket("map", ((f"train/{i:04d}", payload(i)) for i in range(N))) as name:
            yield name

This lives in a module of its own, not in ``tests/conftest.py``: with
several ``conftest.py`` files in the suite, ``from conftest import ...``
finds whichever was imported first.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator

from torchbucket import runtime
from torchbucket.storage.memory import MemoryStore, delete_memory_bucket

__all__ = ["memory_bucket"]


@contextlib.contextmanager
def memory_bucket(tag: str, objects: Iterable[tuple[str, bytes]] = ()) -> Iterator[str]:
    """A new memory bucket named ``<tag>-<8 hex digits>`` holding ``objects``; deleted on exit."""
    name = f"{tag}-{uuid.uuid4().hex[:8]}"
    store = MemoryStore(name)

    async def seed() -> None:
        for key, data in objects:
            await store.put(key, data)

    runtime.run(seed())
    try:
        yield name
    finally:
        delete_memory_bucket(name)
