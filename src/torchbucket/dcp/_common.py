"""What the DCP writer and reader share: the layout of a checkpoint in a bucket.

The layout is exactly ``FileSystemWriter``'s, so a checkpoint copied to a local
folder loads with torch's own ``FileSystemReader``: data files
``__{rank}_{n}.distcp`` and a pickled :class:`Metadata` in ``.metadata``
(``__{rank}.metadata`` per rank when saved without collectives).
"""

from __future__ import annotations

import os

from torchbucket._uri import SCHEMES

__all__ = ["DATA_SUFFIX", "METADATA_NAME", "is_bucket_uri", "join", "metadata_name", "normalize"]

DATA_SUFFIX = ".distcp"
METADATA_NAME = ".metadata"


def normalize(checkpoint_id: str | os.PathLike[str]) -> str:
    """The checkpoint's URI without a trailing slash."""
    return os.fspath(checkpoint_id).rstrip("/")


def is_bucket_uri(checkpoint_id: str | os.PathLike[str]) -> bool:
    """Whether ``checkpoint_id`` is a URI torchbucket serves."""
    text = os.fspath(checkpoint_id)
    return any(text.startswith(f"{scheme}://") for scheme in SCHEMES)


def join(base: str, name: str) -> str:
    """The URI of file ``name`` inside checkpoint ``base``."""
    return f"{base}/{name}"


def metadata_name(rank: int | None) -> str:
    """``.metadata``, or ``__{rank}.metadata`` for a rank's own metadata."""
    return METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
