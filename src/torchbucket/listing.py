"""Listing every object under a prefix.

PLACEHOLDER: a sequential lister with the final signature; the parallel
work-stealing lister replaces the body (issue 3).
"""

from __future__ import annotations

from torchbucket.storage.base import HIDDEN_PREFIXES, ObjectInfo, ObjectStore

__all__ = ["alist_objects"]


async def alist_objects(store: ObjectStore, prefix: str = "") -> list[ObjectInfo]:
    """Every object under ``prefix``, sorted by name, hidden objects excluded."""
    out: list[ObjectInfo] = []
    token: str | None = None
    while True:
        page = await store.list_page(prefix, page_token=token)
        out.extend(
            o
            for o in page.objects
            if not o.name.startswith(HIDDEN_PREFIXES) and not o.name.endswith("/")
        )
        token = page.next_page_token
        if token is None:
            return out
