"""``torchbucket cleanup``: remove what a crashed job left in a bucket.

Four kinds of leftovers cost money and confuse listings: composed objects under
``dataflux-composed-objects/`` (a dataset's coalesced reads; normally deleted at
once, left behind only when a process is killed), incomplete multipart
uploads (a checkpoint save that died; their parts are billed but invisible to a
listing), and staged checkpoint objects (``dir/.name.tbtmp-<16 hex>``: a
multipart save on GCS killed between completing its upload under that hidden
name and deleting it; found by listing every object under the prefix, see
``_staged.py``), and on a zonal (Rapid) bucket data objects under
``torchbucket-zonal-objects/`` that no pointer names (a save killed before its
checkpoint's name pointed at its data; ``SupportsZonal.zonal_orphans``, which
asks the pointer again right before each delete). ``--older-than`` spares
uploads, staged objects and data objects younger than it, which may belong to
a save still running.

Whether the bucket exists is asked of the bucket itself (a bucket GET where the
store has one), never inferred from the multipart listing: an endpoint without
GCS's XML multipart API answers that listing 404, 405 or 501, and then only the
uploads half is skipped, with one warning; the composed objects are still
found and removed.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import re
import time

from torchbucket import runtime
from torchbucket.cli._common import Target, human_bytes, open_target, plural
from torchbucket.cli._staged import Staged, find_staged, remove_staged, when
from torchbucket.errors import BucketNotFoundError, StorageError
from torchbucket.storage import (
    HIDDEN_PREFIXES,
    MultipartUpload,
    ObjectInfo,
    ObjectStore,
    SupportsBucketInfo,
    SupportsZonal,
)
from torchbucket.storage.pages import list_all

__all__ = ["add_cleanup", "find_leftovers", "parse_duration"]

logger = logging.getLogger(__name__)

_COMPOSED_PREFIX = HIDDEN_PREFIXES[0]
_ZONAL = "zonal data object"

#: A zonal data object no pointer names, and when it was last written.
Orphan = tuple[ObjectInfo, float | None]

#: Statuses of a multipart listing that mean "no multipart API here" (not found,
#: method not allowed, not implemented), as opposed to a missing bucket (XML
#: ``NoSuchBucket``) or a refusal (403, which is reported).
_NO_MULTIPART_API = frozenset({404, 405, 501})

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"`` -> seconds.

    Raises:
        argparse.ArgumentTypeError: Not a duration.
    """
    match = _DURATION_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 30, 10m, 2h, 1d)")
    return float(match.group(1)) * _SECONDS[match.group(2)]


async def _check_bucket(store: ObjectStore) -> None:
    """Raise ``BucketNotFoundError`` if a bucket request says the bucket is missing.

    Stores without a bucket request (memory, local) and a bucket whose metadata
    the credentials may not read leave it to the composite listing, which is a
    request on the bucket too.
    """
    if isinstance(store, SupportsBucketInfo) and await store.bucket_exists() is False:
        raise BucketNotFoundError("bucket does not exist", operation="cleanup", uri=store.uri())


async def _find(
    store: ObjectStore, prefix: str, older_than: float, now: float | None
) -> tuple[list[ObjectInfo], list[MultipartUpload] | None, StorageError | None]:
    """Composed objects, incomplete uploads (``None`` without the API), and why not."""
    await _check_bucket(store)
    # The ordinary listing hides composed objects; here they are the point.
    composed = await list_all(store, _COMPOSED_PREFIX)
    try:
        uploads = await store.multipart_list(prefix)
    except StorageError as exc:
        if isinstance(exc, BucketNotFoundError) or exc.status not in _NO_MULTIPART_API:
            raise
        logger.warning(
            "%s has no multipart upload API (listing uploads answered HTTP %s: %s); "
            "skipping incomplete uploads, removing composed objects only",
            store.uri(),
            exc.status,
            exc.message,
        )
        return composed, None, exc
    cutoff = (time.time() if now is None else now) - older_than
    if older_than > 0:
        # An upload of unknown age might be a save still running: spare it.
        uploads = [u for u in uploads if u.initiated is not None and u.initiated <= cutoff]
    return composed, uploads, None


async def find_leftovers(
    store: ObjectStore, prefix: str, *, older_than: float = 0.0, now: float | None = None
) -> tuple[list[ObjectInfo], list[MultipartUpload]]:
    """The composed objects in the bucket and the incomplete uploads under ``prefix``.

    Args:
        store: The bucket.
        prefix: Uploads whose object names start with this count.
        older_than: Only uploads begun at least this many seconds ago.
        now: The current time (seconds since the epoch); the clock when ``None``.

    Returns:
        Composed objects and incomplete uploads, each sorted by name; no uploads
        where the endpoint has no multipart API (one WARNING says so).

    Raises:
        BucketNotFoundError: The bucket does not exist.
    """
    composed, uploads, _ = await _find(store, prefix, older_than, now)
    return composed, uploads or []


async def _orphans(store: ObjectStore, prefix: str, older_than: float) -> list[Orphan]:
    """A zonal bucket's data objects under ``prefix`` that no pointer names."""
    if not isinstance(store, SupportsZonal):
        return []
    return await store.zonal_orphans(prefix, older_than=older_than)


async def _remove(
    store: ObjectStore,
    prefix: str,
    older_than: float,
    staged: list[Staged],
    orphans: list[Orphan],
    *,
    uploads: bool,
) -> tuple[int, tuple[int, int], tuple[int, int], int]:
    from torchbucket.checkpoint import abort_incomplete_uploads
    from torchbucket.compose import cleanup_composites

    composites = await cleanup_composites(store)
    removed = await remove_staged(store, staged)
    zonal = (0, 0)
    if orphans and isinstance(store, SupportsZonal):
        zonal = await store.remove_zonal_orphans(orphans)
    aborted = await abort_incomplete_uploads(store, prefix, older_than=older_than) if uploads else 0
    return composites, removed, zonal, aborted


def _staged_part(count: int, size: int, what: str = "staged checkpoint object") -> list[str]:
    """The staged (or zonal data) objects' words in a summary; none when there are none."""
    return [f"{plural(count, what)} ({human_bytes(size)})"] if count else []


def _joined(parts: list[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _when(upload: MultipartUpload) -> str:
    if upload.initiated is None:
        return "start time unknown"
    stamp = datetime.datetime.fromtimestamp(upload.initiated, tz=datetime.timezone.utc)
    return f"started {stamp:%Y-%m-%d %H:%M:%S} UTC"


def add_cleanup(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``torchbucket cleanup``."""
    parser = sub.add_parser(
        "cleanup",
        parents=[common],
        help="remove leftover composed objects, staged checkpoint objects and incomplete "
        "multipart uploads",
        description=(
            "Remove what crashed jobs leave behind: every composed object under "
            f"{_COMPOSED_PREFIX} in URI's bucket (torchbucket and gcs-torch-dataflux write "
            "them while coalescing small reads; a killed process can leave some), and every "
            "incomplete multipart upload whose object name starts with URI's key (a "
            "checkpoint save that died; its parts are billed but invisible), and every "
            "staged checkpoint object under URI's key (a hidden dir/.name.tbtmp-<16 hex> "
            "that a save killed between completing its upload and putting it in place left; "
            "found by listing every object under URI), and on a zonal (Rapid) bucket every "
            "data object under torchbucket-zonal-objects/ of a key under URI's key that no "
            "pointer names (a save killed before the checkpoint's name pointed at it; the "
            "pointer is asked again right before each delete). Prints each thing found, then a "
            "total. Stop jobs that read or write the bucket first, or use --older-than so a "
            "save still running is left alone. Finding nothing is not an error."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket cleanup --dry-run gs://my-bucket/\n"
            "  torchbucket cleanup --older-than 1h gs://my-bucket/checkpoints/"
        ),
    )
    parser.add_argument("uri", metavar="URI", help="gs://bucket/ or gs://bucket/prefix")
    parser.add_argument(
        "-n", "--dry-run", action="store_true", help="print what would be removed; remove nothing"
    )
    parser.add_argument(
        "--older-than",
        type=parse_duration,
        default=0.0,
        metavar="AGE",
        help="only abort uploads begun, and remove staged checkpoint objects created and "
        "zonal data objects last written, at least this long ago: 90, 90s, 10m, 2h, 1d "
        "(default: 0, every one)",
    )
    parser.set_defaults(func=_cleanup)


def _cleanup(args: argparse.Namespace) -> int:
    target: Target = open_target(args.uri, args.endpoint)
    store = target.store
    try:
        composed, uploads, no_api = runtime.run(_find(store, target.key, args.older_than, None))
        staged = runtime.run(find_staged(store, target.key, older_than=args.older_than))
        staged_bytes = sum(info.size for info, _ in staged)
        orphans = runtime.run(_orphans(store, target.key, args.older_than))
        orphan_bytes = sum(info.size for info, _ in orphans)
        verb = "would remove" if args.dry_run else "removing"
        for obj in composed:
            print(f"{verb} composed object {target.uri_of(obj.name)} ({human_bytes(obj.size)})")
        for obj, created in staged:
            print(
                f"{verb} staged checkpoint object {target.uri_of(obj.name)} "
                f"({human_bytes(obj.size)}{when(created)})"
            )
        for obj, written in orphans:
            print(
                f"{verb} {_ZONAL} {target.uri_of(obj.name)} "
                f"({human_bytes(obj.size)}{when(written, 'last written')})"
            )
        verb = "would abort" if args.dry_run else "aborting"
        for upload in uploads or []:
            print(
                f"{verb} incomplete upload to {target.uri_of(upload.key)} "
                f"(upload id {upload.upload_id}, {_when(upload)})"
            )
        skipped = ""
        if no_api is not None:
            skipped = (
                f"; incomplete uploads not checked: no multipart upload API (HTTP {no_api.status})"
            )
        if args.dry_run:
            parts = [plural(len(composed), "composed object")]
            parts += _staged_part(len(staged), staged_bytes)
            parts += _staged_part(len(orphans), orphan_bytes, _ZONAL)
            if uploads is not None:
                parts.append(plural(len(uploads), "incomplete upload"))
            print(f"dry run: {_joined(parts)} would be removed from {target.uri}{skipped}")
            return 0
        if not composed and not uploads and not staged and not orphans:
            print(f"nothing to clean up in {target.uri}{skipped}")
            return 0
        removed, staged_done, zonal_done, aborted = runtime.run(
            _remove(
                store, target.key, args.older_than, staged, orphans, uploads=uploads is not None
            )
        )
        parts = [plural(removed, "composed object"), *_staged_part(*staged_done)]
        parts += _staged_part(*zonal_done, _ZONAL)
        done = ", ".join(parts) if uploads is not None else _joined(parts)
        if uploads is not None:
            done += f" and aborted {plural(aborted, 'incomplete upload')}"
        print(f"removed {done} in {target.uri}{skipped}")
        return 0
    finally:
        runtime.run(store.close())
