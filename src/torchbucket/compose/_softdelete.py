"""Compose and soft delete: a bucket that keeps deleted objects bills every composite.

Buckets created since March 2024 keep deleted objects for 7 days by default
(https://cloud.google.com/storage/docs/soft-delete, read 2026-12-01), and a
soft-deleted object is billed as storage for its retention window. Compose
writes and deletes one composite per group: an epoch over 1 TB leaves about
1 TB of soft-deleted composites behind, billed for a week. So before composing
on a bucket the bucket's policy is read once per process (one ``buckets.get``,
class B); while retention is on, compose is off for that bucket unless the
config opts in (:attr:`ComposeConfig.allow_with_soft_delete`), with one INFO
line that says why and how to opt in. A policy that cannot be read (403) is
unknown, and compose goes ahead.
"""

from __future__ import annotations

import asyncio
import logging

from torchbucket.compose.config import ComposeConfig
from torchbucket.storage.base import ObjectStore
from torchbucket.storage.capabilities import SupportsSoftDelete, SupportsZonal

__all__ = ["known_retention", "soft_delete_allows", "soft_delete_blocked"]

logger = logging.getLogger(__name__)

# Bucket URI -> retention in seconds (0 off, None unknown), per process.
_retention: dict[str, int | None] = {}
_pending: dict[str, asyncio.Future[int | None]] = {}
_told: set[str] = set()
_told_zonal: set[str] = set()


async def _lookup(store: ObjectStore) -> int | None:
    key = store.uri()
    if key in _retention:
        return _retention[key]
    if not isinstance(store, SupportsSoftDelete):  # memory and local stores keep nothing
        _retention[key] = 0
        return 0
    pending = _pending.get(key)
    if pending is not None and pending.get_loop() is asyncio.get_running_loop():
        return await asyncio.shield(pending)
    future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
    _pending[key] = future
    try:
        seconds = await store.soft_delete_retention()
    except Exception as exc:
        logger.debug("%s: could not read the soft-delete policy: %r", key, exc)
        seconds = None
    finally:
        _pending.pop(key, None)
    _retention[key] = seconds
    future.set_result(seconds)
    return seconds


async def _zonal(store: ObjectStore, config: ComposeConfig) -> bool:
    """Whether ``store``'s bucket is zonal; says once that compose is off there."""
    if not config.enabled or not isinstance(store, SupportsZonal):
        return False
    try:
        zonal = await store.zonal()
    except Exception as exc:  # the compose path then finds out what is wrong
        logger.debug("%s: could not tell whether the bucket is zonal: %r", store.uri(), exc)
        return False
    key = store.uri()
    if zonal and key not in _told_zonal:
        _told_zonal.add(key)
        logger.info(
            "compose is off for %s: a zonal (Rapid) bucket has no compose; small objects are "
            "read directly instead, each on a gRPC bidi stream of its own, many at once on "
            "one connection (the ComposeConfig given does not apply there)",
            key,
        )
    return zonal


def soft_delete_blocked(store: ObjectStore, config: ComposeConfig) -> bool:
    """Whether compose is known to be off for ``store`` because of soft delete."""
    if config.allow_with_soft_delete:
        return False
    return bool(_retention.get(store.uri()))


async def soft_delete_allows(store: ObjectStore, config: ComposeConfig) -> bool:
    """Whether compose may go ahead on ``store`` as far as soft delete goes.

    Reads the bucket's policy on first use (once per process and bucket).
    A zonal bucket (GCS Rapid storage) has no compose at all: there compose
    is off whatever the config says (see :func:`_zonal`).
    """
    if await _zonal(store, config):
        return False
    if config.allow_with_soft_delete:
        return True
    seconds = await _lookup(store)
    if not seconds:
        return True
    key = store.uri()
    if key not in _told:
        _told.add(key)
        logger.info(
            "compose is off for %s: the bucket keeps deleted objects for %.3g days "
            "(soft delete), so every composite would be billed as storage for that long; "
            "reading directly instead. To compose anyway, pass "
            "ComposeConfig(allow_with_soft_delete=True) (see 'torchbucket cost' for what it "
            "costs), or turn soft delete off: gcloud storage buckets update %s "
            "--clear-soft-delete",
            key,
            seconds / 86400,
            key.rstrip("/"),
        )
    return False


def known_retention(store: ObjectStore) -> int | None:
    """The retention read for ``store`` so far (``None``: unknown or not read)."""
    return _retention.get(store.uri())
