"""Listing every object under a prefix: in parallel, once per job, in order.

``alist_objects(store, prefix)`` returns every object whose name starts with
``prefix``, sorted by name (UTF-8 byte order, as GCS sorts), each name once::

    objects = await alist_objects(store, "train/")
    objects = list_objects("gs://my-bucket/train/")          # from sync code

How (see :mod:`._lister`): the first page is fetched plainly, so a
prefix that fits in one page costs one request. Beyond it, key ranges of the
prefix are listed with ``startOffset``/``endOffset`` in one event loop: a probe
looks past the last name seen, and once names are known past a range, the
range is cut into pieces of about a page each from the density of the names
listed, up to :attr:`ListingConfig.pages_in_flight` requests at a time.

What is left out by default: objects under ``dataflux-composed-objects/``
(torchbucket's own temporary composites), the local store's multipart staging
entries, and folder placeholders (names ending in ``/``). Every storage class
is listed unless :attr:`ListingConfig.storage_classes` says otherwise.

Listed once per job: when ``torch.distributed`` is initialised with more than
one rank, rank 0 lists and broadcasts the result, and the other ranks wait for
it instead of listing (:mod:`._broadcast`). Every rank must then call the
listing (it is a collective). With :attr:`ListingConfig.cache` a restarted job can read the
listing back from a manifest instead of listing again.

Failures: each page request is retried by the store's own policy
(:mod:`torchbucket.runtime.retry` for GCS); a page that still fails fails the whole
listing with an error of the same type naming the prefix URI, after the other
listers are cancelled. A partial listing is never returned.
"""

from __future__ import annotations

import logging
import operator
import sys
from typing import TYPE_CHECKING, Any, Literal, Protocol

from torchbucket import runtime
from torchbucket.errors import StorageError, ThrottledError
from torchbucket.listing._broadcast import shared_listing, world
from torchbucket.listing._lister import ListingStats, list_parallel
from torchbucket.listing._manifest import ManifestLocation
from torchbucket.listing.config import ListingConfig
from torchbucket.storage.base import HIDDEN_PREFIXES, ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["ProgressBar", "alist_objects", "list_objects"]

logger = logging.getLogger(__name__)

# The local store stages multipart parts in ".<name>.tbupload-<id>/" and writes
# through ".<name>.tbtmp-<id>"; it skips both, and so does the listing, in case
# a store hands them out anyway.
_LOCAL_STAGING_MARKS = (".tbupload-", ".tbtmp-")

_name = operator.attrgetter("name")


class ProgressBar(Protocol):
    """Anything with ``update(n)``, such as a ``tqdm`` bar the caller owns."""

    def update(self, n: int) -> Any:
        """Count ``n`` more objects found."""
        ...


def _is_staging(name: str) -> bool:
    return any(
        part.startswith(".") and any(mark in part for mark in _LOCAL_STAGING_MARKS)
        for part in name.split("/")
    )


def _filter(objects: list[ObjectInfo], config: ListingConfig) -> list[ObjectInfo]:
    """The objects the configuration keeps (one pass; it runs over every name)."""
    folders, hidden, classes = config.include_folders, config.include_hidden, config.storage_classes
    if classes is None:
        # Usually nothing is left out: find that out with a few scans in C
        # instead of a Python test per name.
        text = "\n" + "\n".join(map(_name, objects)) + "\n"
        drop_folders = not folders and "/\n" in text
        drop_hidden = not hidden and (
            ".tb" in text or any("\n" + p in text for p in HIDDEN_PREFIXES)
        )
        if not drop_folders and not drop_hidden:
            return objects
    # Objects whose store reports no class are kept.
    allowed = None if classes is None else classes | {None}
    out = []
    for obj in objects:
        name = obj.name
        if not folders and name.endswith("/"):
            continue
        if not hidden and (
            name.startswith(HIDDEN_PREFIXES) or (".tb" in name and _is_staging(name))
        ):
            continue
        if allowed is not None and obj.storage_class not in allowed:
            continue
        out.append(obj)
    return out


def _progress_bar(
    progress: bool | Literal["auto"] | ProgressBar | None, config: ListingConfig, uri: str
) -> tuple[ProgressBar | None, Any]:
    """The bar to update and, if this call made it, the bar to close."""
    choice = config.progress if progress is None else progress
    if choice is not True and choice is not False and choice != "auto":
        return choice, None  # the caller's own bar
    show = choice is True or (choice == "auto" and sys.stderr.isatty())
    if not show:
        return None, None
    from tqdm.auto import tqdm

    bar = tqdm(desc=f"listing {uri}", unit=" objects", unit_scale=True, file=sys.stderr)
    return bar, bar


def _rewrap(exc: StorageError, uri: str, found: int) -> StorageError:
    """``exc`` as an error of the same type about the whole listing."""
    # The cause's own message, not str(exc): that repeats the operation, the URI
    # and the HTTP status, which the new error names itself.
    detail = exc.message if exc.uri in ("", uri) else f"{exc.uri}: {exc.message}"
    message = f"listing failed after {found} objects, nothing returned: {detail}"
    try:
        error = type(exc)(message, operation="list", uri=uri, status=exc.status)
    except TypeError:  # a subclass with another constructor
        error = StorageError(message, operation="list", uri=uri, status=exc.status)
    if isinstance(exc, ThrottledError) and isinstance(error, ThrottledError):
        error.retry_after = exc.retry_after
    return error


async def _list_here(
    store: ObjectStore,
    prefix: str,
    config: ListingConfig,
    progress: bool | Literal["auto"] | ProgressBar | None,
    stats: ListingStats | None,
) -> list[ObjectInfo]:
    uri = store.uri(prefix)
    filters = config._filters()
    manifest = ManifestLocation(config.cache, store) if config.cache is not None else None
    if manifest is not None:
        cached = await manifest.read(uri, prefix, filters, config.cache_max_age)
        if cached is not None:
            return cached
    bar, owned = _progress_bar(progress, config, uri)
    found = 0

    def on_page(count: int) -> None:
        nonlocal found
        found += count
        if bar is not None:
            bar.update(count)

    try:
        objects = await list_parallel(
            store,
            prefix,
            parallelism=config.pages_in_flight,
            page_size=config.objects_per_page,
            on_page=on_page,
            stats=stats,
        )
    except StorageError as exc:
        raise _rewrap(exc, uri, found) from exc
    finally:
        if owned is not None:
            owned.close()
    kept = _filter(objects, config)
    if manifest is not None:
        kept = [o for o in kept if not manifest.is_object(store, o.name)]
        await manifest.write(uri, filters, kept)
    logger.debug("listed %s: %d objects", uri, len(kept))
    return kept


async def alist_objects(
    store: ObjectStore,
    prefix: str = "",
    *,
    config: ListingConfig | None = None,
    progress: bool | Literal["auto"] | ProgressBar | None = None,
    stats: ListingStats | None = None,
) -> list[ObjectInfo]:
    """Every object under ``prefix``, sorted by name, each once.

    Args:
        store: The store to list.
        prefix: Names that start with this; ``""`` for the whole bucket.
        config: How to list; defaults to ``ListingConfig()``.
        progress: Overrides ``config.progress``: ``True``, ``False``,
            ``"auto"``, or a bar of the caller's (anything with ``update(n)``).
        stats: Filled with the requests and key ranges this call used (on the
            rank that listed).

    Returns:
        The objects in UTF-8 byte order of name; empty when nothing is under
        the prefix.

    Raises:
        StorageError: A page failed after the store's retries (the same type as
            the page's error, naming the prefix URI); on every rank when the
            listing is broadcast.
    """
    config = config or ListingConfig()
    rank, size = world() if config.broadcast is not False else (0, 1)
    if size == 1:
        return await _list_here(store, prefix, config, progress, stats)
    return await shared_listing(
        rank, store.uri(prefix), lambda: _list_here(store, prefix, config, progress, stats)
    )


def list_objects(
    uri: str,
    *,
    config: ListingConfig | None = None,
    progress: bool | Literal["auto"] | ProgressBar | None = None,
    gcs: GCSConfig | None = None,
) -> list[ObjectInfo]:
    """Every object under a prefix URI, sorted by name: the synchronous form.

    Args:
        uri: ``gs://bucket/prefix``, ``memory://name/prefix`` or ``file:///dir/``.
        config: How to list; defaults to ``ListingConfig()``.
        progress: Overrides ``config.progress`` (see :func:`alist_objects`).
        gcs: A :class:`~torchbucket.storage.gcs.GCSConfig` for ``gs://``.

    Returns:
        The objects in UTF-8 byte order of name; empty when nothing is there.

    Raises:
        InvalidURIError: ``uri`` is malformed.
        StorageError: The listing failed (see :func:`alist_objects`).
    """
    from torchbucket.storage import store_for

    options = {} if gcs is None else {"config": gcs}
    store, prefix = store_for(uri, **options)
    try:
        return runtime.run(alist_objects(store, prefix, config=config, progress=progress))
    finally:
        runtime.run(store.close())
