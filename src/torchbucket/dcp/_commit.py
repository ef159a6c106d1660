"""How a DCP save ends: ``.metadata`` written only if no other save finished first.

Every save writes data files of its own (their names carry the save's token),
so two saves to one place never write into each other's files. The save that
writes ``.metadata`` first wins: ``.metadata`` is written with a "does not
exist" precondition (the save deleted the old one before writing any data), so
a save that finishes later fails with :class:`PreconditionFailedError`, deletes
its own data files and leaves the winner whole. After a save wins, the data
files of the checkpoint it replaced are deleted.

The old ``.metadata`` is read and deleted by the generation the save found: a
``.metadata`` another save committed in between is that save's checkpoint,
which this one must neither delete (orphaning its data files) nor take the
data files of for its own to replace.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterable

from torch.distributed.checkpoint.metadata import Metadata

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.dcp._common import DATA_SUFFIX, join
from torchbucket.dcp._unpickle import load_metadata
from torchbucket.errors import NotFoundError, PreconditionFailedError, StorageError

#: .metadata is a pickle: opaque bytes, as every checkpoint object is stored.
CONTENT_TYPE = "application/octet-stream"

__all__ = ["commit_metadata", "delete_metadata", "files_of"]

logger = logging.getLogger(__name__)


def _own_file(name: object) -> bool:
    """Whether ``name`` is a data file directly inside the checkpoint (never elsewhere)."""
    return (
        isinstance(name, str)
        and name.endswith(DATA_SUFFIX)
        and "/" not in name
        and "\\" not in name
        and not name.startswith(".")
    )


def files_of(
    checkpoint: BucketCheckpoint, uri: str, name: str, generation: int | None
) -> list[str]:
    """The data files generation ``generation`` of metadata ``name`` of checkpoint ``uri`` points into.

    ``[]`` when there is none (any more), or it cannot be read as DCP metadata
    (then the files it may have pointed into stay: nothing is deleted on a guess).
    """
    metadata_uri = join(uri, name)
    store, key = checkpoint.open(metadata_uri)
    try:
        data = runtime.run(store.get(key, generation=generation))
        metadata = load_metadata(data, metadata_uri)
    except NotFoundError:
        return []
    except StorageError as exc:
        logger.warning("%s: not deleting the data files of the checkpoint replaced: %s", uri, exc)
        return []
    names = {
        getattr(info, "relative_path", None) for info in (metadata.storage_data or {}).values()
    }
    return sorted(n for n in names if _own_file(n))  # type: ignore[misc]


def delete_metadata(
    checkpoint: BucketCheckpoint, uri: str, name: str, generation: int | None
) -> None:
    """Delete generation ``generation`` of metadata ``name``; one gone or replaced since is left.

    Left, a ``.metadata`` another save committed meanwhile makes this save's
    commit fail (the first to finish wins), instead of being deleted unseen.
    """
    store, key = checkpoint.open(join(uri, name))
    try:
        runtime.run(store.delete(key, generation=generation))
    except NotFoundError:
        logger.debug("%s: %s was deleted or replaced since it was read", uri, name)


def _delete(checkpoint: BucketCheckpoint, uri: str, names: Iterable[str], what: str) -> None:
    for name in names:
        try:
            checkpoint.delete(join(uri, name), missing_ok=True)
        except StorageError as exc:
            logger.warning("%s: could not delete %s %s: %s", uri, what, name, exc)


def commit_metadata(
    checkpoint: BucketCheckpoint,
    uri: str,
    name: str,
    metadata: Metadata,
    *,
    written: set[str],
    replaced: Iterable[str],
) -> None:
    """Write ``metadata`` as ``name`` unless another save's is there; then tidy up.

    Args:
        checkpoint: Where to write.
        uri: The checkpoint.
        name: ``.metadata`` or a rank's ``__{rank}.metadata``.
        metadata: The metadata, pins included.
        written: The data files this save wrote.
        replaced: The data files of the checkpoint this save replaces, deleted
            once the metadata is written.

    Raises:
        PreconditionFailedError: Another save to ``uri`` wrote its metadata
            first; this save's data files were deleted, the other save stands.
        StorageError: The metadata could not be written.
    """
    store, key = checkpoint.open(join(uri, name))
    data = pickle.dumps(metadata)
    try:
        runtime.run(store.put(key, data, if_generation_match=0, content_type=CONTENT_TYPE))
    except PreconditionFailedError as exc:
        _delete(checkpoint, uri, sorted(written), "this save's data file")
        raise PreconditionFailedError(
            f"another save to this checkpoint finished first (its {name} appeared while "
            "this one saved): that save is the checkpoint; this save's data files were deleted",
            operation="dcp save",
            uri=uri,
        ) from exc
    _delete(checkpoint, uri, sorted(set(replaced) - written), "replaced data file")
