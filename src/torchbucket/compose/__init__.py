"""Small-object coalescing: compose groups of small objects server-side, read once.

Reading thousands of 10 KiB objects one request each costs a request and some
client CPU per object. Up to 32 objects can instead be composed server-side into
one composite under ``dataflux-composed-objects/``, read with one GET, split
back by the objects' listed sizes, and the composite deleted::

    config = ComposeConfig(max_composite_object_size=4 << 20)
    groups = plan_groups(sizes, max_composite_object_size=config.max_composite_object_size)
    parts = await fetch_group(store, [infos[i] for i in groups[0]], config)

Sources are pinned to their listed generations and the composite is created with
``ifGenerationMatch=0``; anything that goes wrong on the way (a rewritten source,
a refusal, throttling) falls back to direct reads, which are themselves pinned
and size-checked, so the bytes returned are always the listed objects' bytes.

A dataset's prefetch window names an empty anchor object as each compose's
first source and deletes it at its end, which revokes the composes not yet
applied (see :class:`Anchor`). Composites are deleted in ``finally``; those
still in flight when the process exits or gets SIGTERM are deleted by a
process-wide registry (see :mod:`torchbucket.compose.registry`);
:func:`cleanup_composites` removes what a killed process left behind.
"""

from __future__ import annotations

import asyncio

from torchbucket.compose._anchor import Anchor, window_anchored
from torchbucket.compose._fetch import compose_allowed, fetch_group
from torchbucket.compose._plan import plan_groups
from torchbucket.compose._softdelete import soft_delete_allows
from torchbucket.compose.config import (
    COMPOSITE_PREFIX,
    DEFAULT_MAX_COMPOSITE_OBJECT_SIZE,
    ComposeConfig,
)
from torchbucket.errors import NotFoundError
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage.base import ObjectStore
from torchbucket.storage.pages import list_pages

__all__ = [
    "COMPOSITE_PREFIX",
    "DEFAULT_MAX_COMPOSITE_OBJECT_SIZE",
    "Anchor",
    "ComposeConfig",
    "cleanup_composites",
    "compose_allowed",
    "fetch_group",
    "plan_groups",
    "soft_delete_allows",
    "window_anchored",
]

_CLEANUP_CONCURRENCY = 32


async def cleanup_composites(store: ObjectStore, prefix: str = "") -> int:
    """Delete every composite in a bucket, or those under a sub-prefix.

    For composites left behind by processes that were killed outright. Run it
    when no job reads the bucket with compose on: a running job's composites
    live for one compose-GET-delete cycle, and deleting one under it makes that
    group fall back to direct reads.

    Args:
        store: The bucket.
        prefix: Only composites whose names start with
            ``"dataflux-composed-objects/" + prefix``.

    Returns:
        How many composites were deleted.

    Raises:
        StorageError: Listing or deleting failed (a composite already gone
            does not count as a failure).
    """
    full = COMPOSITE_PREFIX + prefix
    semaphore = asyncio.Semaphore(_CLEANUP_CONCURRENCY)

    async def delete(name: str) -> int:
        async with semaphore:
            try:
                await store.delete(name)
            except NotFoundError:
                return 0
            return 1

    deleted = 0
    async for page in list_pages(store, full):  # a page's deletes end before the next page
        deleted += sum(await gather_or_cancel(delete(o.name) for o in page.objects))
    return deleted
