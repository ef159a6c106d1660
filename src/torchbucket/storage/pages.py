"""Every page of a plain listing, one request after another.

For the few places that want a prefix's objects as the store lists them, hidden
names included, without the parallel lister of :mod:`torchbucket.listing`
(which skips :data:`~torchbucket.storage.base.HIDDEN_PREFIXES`): cleanup of
composed objects, a demo bucket's leftovers, a filesystem's directory listing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from torchbucket.storage.base import ListPage, ObjectInfo, ObjectStore

__all__ = ["list_all", "list_pages"]


async def list_pages(store: ObjectStore, prefix: str = "") -> AsyncIterator[ListPage]:
    """Yield the pages of ``store.list_page(prefix)``, following their tokens."""
    token: str | None = None
    while True:
        page = await store.list_page(prefix, page_token=token)
        yield page
        token = page.next_page_token
        if token is None:
            return


async def list_all(store: ObjectStore, prefix: str = "") -> list[ObjectInfo]:
    """Every object whose name starts with ``prefix``, in the store's order."""
    return [info async for page in list_pages(store, prefix) for info in page.objects]
