"""What the DCP writer and reader share: the layout of a checkpoint in a bucket.

The layout is ``FileSystemWriter``'s, so a checkpoint copied to a local
folder loads with torch's own ``FileSystemReader``: data files and a pickled
:class:`Metadata` in ``.metadata`` (``__{rank}.metadata`` per rank when saved
without collectives) that names them. Only the data files' names differ:
``__{rank}_{n}.{token}.distcp``, the token new for every save, so that two
saves to one place never write into each other's files. ``.metadata`` also
records each data file's generation, size and CRC32C (:mod:`._pins`).
"""

from __future__ import annotations

import os
from typing import Any

from torchbucket._checks import check_instance
from torchbucket._uri import is_bucket_uri, parse_uri, uri_text
from torchbucket.errors import ConfigError

__all__ = [
    "DATA_SUFFIX",
    "METADATA_NAME",
    "check_dcp_arguments",
    "join",
    "metadata_name",
    "normalize",
]

DATA_SUFFIX = ".distcp"
METADATA_NAME = ".metadata"


def normalize(checkpoint_id: str | os.PathLike[str]) -> str:
    """The checkpoint's URI without a trailing slash (a ``Path`` of a URI read as the URI)."""
    return uri_text(checkpoint_id).rstrip("/")


def join(base: str, name: str) -> str:
    """The URI of file ``name`` inside checkpoint ``base``."""
    return f"{base}/{name}"


def metadata_name(rank: int | None) -> str:
    """``.metadata``, or ``__{rank}.metadata`` for a rank's own metadata."""
    return METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"


def check_dcp_arguments(
    owner: object, uri: Any, checkpoint: Any, gcs: Any, bucket_checkpoint: Any
) -> None:
    """Check a DCP writer's or reader's common arguments at construction.

    Raises:
        ConfigError: ``uri`` is not a string or path, an option is not of its
            type, or ``bucket_checkpoint`` came with ``checkpoint`` or ``gcs``.
        InvalidURIError: ``uri`` is not a URI torchbucket serves.
    """
    from torchbucket.checkpoint.checks import check_checkpoint_arguments

    name = type(owner).__name__
    check_instance(uri, (str, os.PathLike), owner=name, parameter="uri", optional=False)
    if not is_bucket_uri(uri):
        raise ConfigError(
            f"{name}: uri must be a gs://, gcs://, memory:// or file:// URI, got {uri!r}"
        )
    parse_uri(normalize(uri))
    check_checkpoint_arguments(name, checkpoint, gcs, bucket_checkpoint)
