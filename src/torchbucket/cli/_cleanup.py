"""``torchbucket cleanup``: remove what a crashed job left in a bucket.

Two kinds of leftovers cost money and confuse listings: composed objects under
``dataflux-composed-objects/`` (a dataset's coalesced reads; normally deleted at
once, left behind only when a process is killed) and incomplete multipart
uploads (a checkpoint save that died). Their parts are billed but invisible to a
listing.

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
from torchbucket.errors import BucketNotFoundError, StorageError
from torchbucket.storage import HIDDEN_PREFIXES, MultipartUpload, ObjectInfo, ObjectStore

__all__ = ["add_cleanup", "find_leftovers", "parse_duration"]

logger = logging.getLogger(__name__)

_COMPOSED_PREFIX = HIDDEN_PREFIXES[0]

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


async def _list_hidden(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    # The ordinary listing hides composed objects; here they are the point.
    out: list[ObjectInfo] = []
    token: str | None = None
    while True:
        page = await store.list_page(prefix, page_token=token)
        out.extend(page.objects)
        token = page.next_page_token
        if token is None:
            return out


async def _check_bucket(store: ObjectStore) -> None:
    """Raise ``BucketNotFoundError`` if a bucket request says the bucket is missing.

    Stores without a bucket request (memory, local) and a bucket whose metadata
    the credentials may not read leave it to the composite listing, which is a
    request on the bucket too.
    """
    exists = getattr(store, "bucket_exists", None)
    if exists is not None and await exists() is False:
        raise BucketNotFoundError("bucket does not exist", operation="cleanup", uri=store.uri())


async def _find(
    store: ObjectStore, prefix: str, older_than: float, now: float | None
) -> tuple[list[ObjectInfo], list[MultipartUpload] | None, StorageError | None]:
    """Composed objects, incomplete uploads (``None`` without the API), and why not."""
    await _check_bucket(store)
    composed = await _list_hidden(store, _COMPOSED_PREFIX)
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


async def _remove(
    store: ObjectStore, prefix: str, older_than: float, *, uploads: bool
) -> tuple[int, int]:
    from torchbucket.checkpoint import abort_incomplete_uploads
    from torchbucket.compose import cleanup_composites

    composites = await cleanup_composites(store)
    aborted = await abort_incomplete_uploads(store, prefix, older_than=older_than) if uploads else 0
    return composites, aborted


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
        help="remove leftover composed objects and incomplete multipart uploads",
        description=(
            "Remove what crashed jobs leave behind: every composed object under "
            f"{_COMPOSED_PREFIX} in URI's bucket (torchbucket and gcs-torch-dataflux write "
            "them while coalescing small reads; a killed process can leave some), and every "
            "incomplete multipart upload whose object name starts with URI's key (a "
            "checkpoint save that died; its parts are billed but invisible). Prints each "
            "thing found, then a total. Stop jobs that read or write the bucket first, or "
            "use --older-than so a save still running is left alone. Finding nothing is "
            "not an error."
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
        help="only abort uploads begun at least this long ago: 90, 90s, 10m, 2h, 1d "
        "(default: 0, every upload)",
    )
    parser.set_defaults(func=_cleanup)


def _cleanup(args: argparse.Namespace) -> int:
    target: Target = open_target(args.uri, args.endpoint)
    store = target.store
    try:
        composed, uploads, no_api = runtime.run(_find(store, target.key, args.older_than, None))
        verb = "would remove" if args.dry_run else "removing"
        for obj in composed:
            print(f"{verb} composed object {target.uri_of(obj.name)} ({human_bytes(obj.size)})")
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
            uploads_part = (
                "" if uploads is None else f" and {plural(len(uploads), 'incomplete upload')}"
            )
            print(
                f"dry run: {plural(len(composed), 'composed object')}{uploads_part} "
                f"would be removed from {target.uri}{skipped}"
            )
            return 0
        if not composed and not uploads:
            print(f"nothing to clean up in {target.uri}{skipped}")
            return 0
        removed, aborted = runtime.run(
            _remove(store, target.key, args.older_than, uploads=uploads is not None)
        )
        uploads_part = (
            "" if uploads is None else f" and aborted {plural(aborted, 'incomplete upload')}"
        )
        print(
            f"removed {plural(removed, 'composed object')}{uploads_part} in {target.uri}{skipped}"
        )
        return 0
    finally:
        runtime.run(store.close())
