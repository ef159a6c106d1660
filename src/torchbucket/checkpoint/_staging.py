"""A multipart checkpoint is assembled under a staging name, checked, then put in place.

GCS checks every part of an XML multipart upload against the hash sent with it,
but nothing checks the object the completion assembles from them
(https://cloud.google.com/storage/docs/data-validation: MD5 does not apply to
it, and the completion request has no hash of its own,
https://cloud.google.com/storage/docs/xml-api/post-object-complete). The
client can compare the assembled object's CRC32C with that of everything it
wrote, but a completion to the checkpoint's own name has already replaced the
previous checkpoint by then. So on a store like that the upload goes to a
hidden name next to the checkpoint (``dir/.name.tbtmp-<random>``, with a
digest for ``name`` where that would pass GCS's 1,024 bytes: see
:mod:`~torchbucket.checkpoint.staged_names`; torchbucket's listings skip it,
as they skip the local store's staging files);
once its size and CRC32C are those written, it is copied onto the checkpoint
by one server-side rewrite and deleted. A mismatch leaves the checkpoint as it
was. The copy and the delete name the generation checked: a writer that
replaces the staged object after its check (the name is in listings that
include hidden names) gets neither its bytes copied onto the checkpoint nor
its object deleted.

The copy costs one request, no data: a rewrite within a bucket that keeps the
storage class completes in a single call
(https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite), and GCS
validates a copy against the source's checksum itself (data-validation page,
"Server-side validation"). The delete is one more request.

The staging name is registered with the process's cleanup registry (the one
that deletes composites at exit and on SIGTERM) from before the completion, so
a process that ends mid-save leaves nothing behind. One killed outright may
leave an incomplete upload under the staging prefix, which the next save of the
same checkpoint (``stale_upload_age``) or ``torchbucket cleanup`` aborts, or,
killed in the moment between completion and delete, the hidden staged object,
which ``torchbucket cleanup`` deletes (``cli/_staged.py``: it takes exactly the
names :func:`is_staging_name` accepts, and with ``--older-than`` only those
whose creation time is older).
"""

from __future__ import annotations

import logging

from torchbucket.checkpoint.staged_names import (
    STAGING_MARK,
    is_staging_name,
    staging_key,
    staging_prefix,
)
from torchbucket.compose.registry import register, unregister
from torchbucket.errors import IntegrityError, NotFoundError, StorageError
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.capabilities import UncheckedMultipartAssembly

__all__ = [
    "STAGING_MARK",
    "check_holds",
    "drop",
    "is_staging_name",
    "promote",
    "register_staging",
    "renamed",
    "stages_multipart",
    "staging_key",
    "staging_prefix",
]

logger = logging.getLogger(__name__)


def stages_multipart(store: ObjectStore) -> bool:
    """Whether ``store`` assembles multipart uploads without checking the result.

    True for a store with :class:`UncheckedMultipartAssembly` (GCS); the memory
    and local stores assemble in process, where nothing is in transit.
    """
    return isinstance(store, UncheckedMultipartAssembly) and store.unchecked_multipart_assembly


def check_holds(
    info: ObjectInfo, *, size: int, crc32c: str, what: str, uri: str, outcome: str
) -> None:
    """Raise :class:`IntegrityError` unless ``info`` has ``size`` bytes and ``crc32c``.

    A store that reports no CRC32C is checked by size alone.
    """
    if info.size == size and info.crc32c in (None, crc32c):
        if info.crc32c is None:
            logger.debug("%s: the store reports no CRC32C; size checked only", uri)
        return
    raise IntegrityError(
        f"{what} ({info.size} bytes, crc32c {info.crc32c}) differs from what was written "
        f"({size} bytes, crc32c {crc32c}); {outcome}",
        operation="checkpoint save",
        uri=uri,
    )


def register_staging(store: ObjectStore, name: str) -> None:
    """Have ``name`` deleted at process exit unless :func:`drop` removes it first."""
    register(store, name)


async def promote(
    store: ObjectStore, staged: ObjectInfo, key: str, *, size: int, crc32c: str | None
) -> ObjectInfo:
    """Check the staged object, copy it onto ``key``, delete it.

    Args:
        store: The bucket.
        staged: The assembled object under its staging name.
        key: The checkpoint's name.
        size: Bytes written.
        crc32c: Their CRC32C, or ``None`` to check the size only.

    Returns:
        The checkpoint's object.

    Raises:
        IntegrityError: The staged object is not what was written, or was
            replaced or deleted before its copy; the checkpoint was not
            touched. Raised after the staged object is gone (or left
            registered for deletion at exit, when that failed).
        StorageError: The copy failed; the checkpoint was not replaced.
    """
    uri = store.uri(key)
    try:
        check_holds(
            staged,
            size=size,
            crc32c=crc32c or staged.crc32c or "",
            what="the assembled upload",
            uri=uri,
            outcome="the checkpoint was not replaced",
        )
        try:
            info = await store.copy(staged.name, key, source_generation=staged.generation)
        except NotFoundError as exc:
            raise IntegrityError(
                f"the assembled upload (staged as {store.uri(staged.name)}, generation "
                f"{staged.generation}) was replaced or deleted before its copy; "
                "the checkpoint was not replaced",
                operation="checkpoint save",
                uri=uri,
            ) from exc
    finally:
        await drop(store, staged.name, staged.generation)
    # GCS validates a copy itself; this only guards a store that does not.
    check_holds(
        info,
        size=size,
        crc32c=crc32c or info.crc32c or "",
        what="the copy onto the checkpoint",
        uri=uri,
        outcome="the checkpoint holds it",
    )
    return info


async def drop(store: ObjectStore, name: str, generation: int | None = None) -> None:
    """Delete a staging object (gone already is fine) and forget it.

    A failure is logged, not raised: the object stays registered for deletion
    at exit, and is hidden from listings meanwhile.
    """
    try:
        await store.delete(name, generation=generation)
    except NotFoundError:
        pass
    except StorageError:
        logger.warning(
            "could not delete the staging object %s; it is deleted at exit",
            store.uri(name),
            exc_info=True,
        )
        return
    unregister(store, name)


def renamed(exc: StorageError, staging_uri: str, uri: str) -> StorageError:
    """``exc`` naming the checkpoint ``uri``, if it named the staging object.

    A user saved ``uri``; the staging name is said in the message, once.
    """
    if exc.uri != staging_uri:
        return exc
    out = type(exc)(
        f"{exc.message} (staged as {staging_uri})",
        operation=exc.operation,
        uri=uri,
        status=exc.status,
    )
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        out.retry_after = retry_after  # type: ignore[attr-defined]
    return out
