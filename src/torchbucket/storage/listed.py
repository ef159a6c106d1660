"""Reading an object as it was listed: its listed generation, checked against its size.

A dataset lists once and reads many times; what it reads must be what it
listed. Every plain read of a listed object (a dataset's sample, the direct
reads a compose group falls back to) goes through :func:`read_verified`.
"""

from __future__ import annotations

from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["read_verified"]


async def read_verified(store: ObjectStore, info: ObjectInfo) -> bytes:
    """Read one object as listed: its listed generation, checked against its size.

    Raises:
        NotFoundError: The object is gone, or was rewritten since it was listed.
        IntegrityError: It is not the size it was listed with.
    """
    try:
        data = await store.get(info.name, generation=info.generation)
    except NotFoundError as exc:
        if info.generation is None:
            raise
        raise NotFoundError(
            f"object was deleted or rewritten since it was listed (listed generation "
            f"{info.generation}); list the dataset again to read the new version",
            operation="get",
            uri=store.uri(info.name),
            status=exc.status,
        ) from exc
    # A gzip object (Content-Encoding: gzip) was listed with its stored size;
    # its decoded bytes (what a read returns) have another length.
    if len(data) != info.size and not info.transcoded:
        raise IntegrityError(
            f"read {len(data)} bytes, but the object was listed with {info.size}: it changed "
            "since it was listed",
            operation="get",
            uri=store.uri(info.name),
        )
    return data
