"""The staged checkpoint objects that ``torchbucket cleanup`` removes.

On GCS a multipart checkpoint save completes its upload under a hidden staging
name next to the checkpoint (``dir/.name.tbtmp-<16 hex>``), checks it, copies
it onto the checkpoint and deletes it (see ``checkpoint/_staging.py``). A
process killed between the completion and that delete leaves the staged object:
stored and billed, but hidden by torchbucket's listings. Only names exactly of
that form are taken (:func:`~torchbucket.checkpoint._staging.is_staging_name`),
never a user's object that merely looks alike.

A staged object younger than ``--older-than`` may belong to a save still
running; its age is its creation time (``timeCreated`` on GCS, one metadata
request each, asked only when ``--older-than`` is set). A store that cannot say
when an object was written (memory, local) has its staged objects spared then,
as an upload of unknown age is.
"""

from __future__ import annotations

import asyncio
import datetime
import time

from torchbucket.checkpoint.staged_names import is_staging_name
from torchbucket.errors import NotFoundError
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage import ObjectInfo, ObjectStore, SupportsCreationTime

__all__ = ["Staged", "find_staged", "remove_staged", "when"]

_PARALLELISM = 16

#: A staged object and its creation time (seconds since the epoch), if asked for and known.
Staged = tuple[ObjectInfo, float | None]


async def _created(store: ObjectStore, info: ObjectInfo) -> float | None:
    if not isinstance(store, SupportsCreationTime):
        return None
    return await store.created(info.name, generation=info.generation)


async def find_staged(
    store: ObjectStore, prefix: str, *, older_than: float, now: float | None = None
) -> list[Staged]:
    """The staged checkpoint objects under ``prefix`` old enough to remove, by name.

    Args:
        store: The bucket.
        prefix: Object names that start with this (``""``: the whole bucket).
        older_than: Only objects created at least this many seconds ago; 0 takes
            every one, without asking any object's age.
        now: The current time (seconds since the epoch); the clock when ``None``.

    Raises:
        StorageError: The listing, or a request for an object's age, failed.
    """
    config = ListingConfig(include_hidden=True, progress=False, broadcast=False)
    staged = [
        o for o in await alist_objects(store, prefix, config=config) if is_staging_name(o.name)
    ]
    if older_than <= 0 or not staged:
        return [(o, None) for o in staged]
    cutoff = (time.time() if now is None else now) - older_than
    semaphore = asyncio.Semaphore(_PARALLELISM)

    async def age(info: ObjectInfo) -> Staged | None:
        async with semaphore:
            try:
                stamp = await _created(store, info)
            except NotFoundError:
                return None  # deleted meanwhile: the save it belonged to finished
        # Unknown age might be a save still running: spare it.
        return (info, stamp) if stamp is not None and stamp <= cutoff else None

    return [s for s in await gather_or_cancel(age(o) for o in staged) if s is not None]


async def remove_staged(store: ObjectStore, staged: list[Staged]) -> tuple[int, int]:
    """Delete ``staged``, each the generation listed.

    Returns:
        How many objects, and bytes, this call deleted (one gone already is not counted).
    """
    semaphore = asyncio.Semaphore(_PARALLELISM)

    async def remove(info: ObjectInfo) -> int:
        async with semaphore:
            try:
                await store.delete(info.name, generation=info.generation)
            except NotFoundError:
                return -1  # gone already
            return info.size

    sizes = [n for n in await gather_or_cancel(remove(info) for info, _ in staged) if n >= 0]
    return len(sizes), sum(sizes)


def when(created: float | None, what: str = "created") -> str:
    """``", created 2024-05-01 12:00:00 UTC"``, or ``""`` when not known."""
    if created is None:
        return ""
    stamp = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    return f", {what} {stamp:%Y-%m-%d %H:%M:%S} UTC"
