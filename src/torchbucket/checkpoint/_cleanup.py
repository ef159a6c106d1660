"""Aborting multipart uploads that a crashed save left behind."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Sequence

from torchbucket import runtime
from torchbucket.errors import NotFoundError, StorageError
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage.base import MultipartUpload, ObjectStore

__all__ = ["abort_incomplete_uploads", "abort_stale_after_save", "abort_uploads"]

logger = logging.getLogger(__name__)

_ABORT_PARALLELISM = 16


async def abort_uploads(
    store: ObjectStore,
    prefix: str,
    *,
    older_than: float,
    exact: bool = False,
    listed: Sequence[MultipartUpload] | None = None,
    keep: str | None = None,
) -> int:
    """Abort incomplete uploads under ``prefix`` (to exactly ``prefix`` if ``exact``).

    Args:
        store: The bucket.
        prefix: The key prefix (the key, with ``exact``).
        older_than: Only uploads that began at least this many seconds ago.
        exact: Only uploads to exactly ``prefix``.
        listed: ``store.multipart_list(prefix)``, if already listed.
        keep: An upload id never to abort (the caller's own).
    """
    uploads = await store.multipart_list(prefix) if listed is None else listed
    now = time.time()
    stale = [
        upload
        for upload in uploads
        if (not exact or upload.key == prefix)
        and upload.upload_id != keep
        and (
            older_than <= 0
            or (upload.initiated is not None and now - upload.initiated >= older_than)
        )
    ]
    if not stale:
        return 0
    semaphore = asyncio.Semaphore(_ABORT_PARALLELISM)

    async def abort(key: str, upload_id: str) -> int:
        async with semaphore:
            try:
                await store.multipart_abort(key, upload_id)
            except NotFoundError:
                return 0  # finished or aborted by someone else meanwhile
            logger.debug("aborted multipart upload %s to %s", upload_id, store.uri(key))
            return 1

    results = await gather_or_cancel(abort(u.key, u.upload_id) for u in stale)
    return sum(results)


async def abort_incomplete_uploads(
    store: ObjectStore, prefix: str = "", older_than: float = 0.0
) -> int:
    """Abort the incomplete multipart uploads under ``prefix``.

    A save killed mid-way (SIGKILL, a lost node) leaves its multipart upload
    behind: invisible, but its parts are stored (and billed) until aborted.

    Args:
        store: The bucket.
        prefix: Only uploads to keys that start with this. Default: all.
        older_than: Only uploads that began at least this many seconds ago, so
            that saves still running are left alone. Default 0: every upload.
            An upload whose start time the store does not report counts as old
            only when ``older_than`` is 0.

    Returns:
        How many uploads were aborted.

    Raises:
        StorageError: Listing or aborting failed.
    """
    return await abort_uploads(store, prefix, older_than=older_than)


def abort_stale_after_save(
    store: ObjectStore,
    uri: str,
    prefix: str,
    listing: concurrent.futures.Future[list[MultipartUpload]],
    age: float,
    *,
    exact: bool,
    keep: str | None,
) -> None:
    """After a save of ``uri``: abort the uploads ``listing`` found that earlier saves left.

    A failure is logged, not raised: the checkpoint is saved, and a leftover
    upload only costs storage until ``torchbucket cleanup`` runs.
    """
    try:
        listed = listing.result()
        aborted = runtime.run(
            abort_uploads(store, prefix, older_than=age, exact=exact, listed=listed, keep=keep)
        )
    except StorageError:
        logger.warning("could not abort stale multipart uploads to %s", uri, exc_info=True)
        return
    if aborted:
        logger.info("aborted %d stale multipart upload(s) to %s", aborted, uri)
