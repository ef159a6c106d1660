"""Reading an object as it was listed: its listed generation, checked against its size.

A dataset lists once and reads many times; what it reads must be what it
listed. Every plain read of a listed object (a dataset's sample, the direct
reads a compose group falls back to) goes through :func:`read_verified`; a
read of another shape (into a buffer, in ranges) says what went wrong the same
way, with :func:`as_listed` and :func:`check_listed_size`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["as_listed", "check_listed_size", "read_verified"]


@contextlib.contextmanager
def as_listed(store: ObjectStore, info: ObjectInfo) -> Iterator[None]:
    """Say "rewritten since it was listed" where a read of ``info``'s generation finds none.

    Raises:
        NotFoundError: From the block; one that says the object was deleted or
            rewritten since it was listed where ``info`` has a generation.
    """
    try:
        yield
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


def check_listed_size(store: ObjectStore, info: ObjectInfo, got: int) -> None:
    """Raise :class:`IntegrityError` unless ``got`` bytes is the size ``info`` was listed with."""
    if got != info.size:
        raise IntegrityError(
            f"read {got} bytes, but the object was listed with {info.size}: it changed "
            "since it was listed",
            operation="get",
            uri=store.uri(info.name),
        )


async def read_verified(store: ObjectStore, info: ObjectInfo) -> bytes:
    """Read one object as listed: its listed generation, checked against its size.

    Raises:
        NotFoundError: The object is gone, or was rewritten since it was listed.
        IntegrityError: It is not the size it was listed with.
    """
    with as_listed(store, info):
        data = await store.get(info.name, generation=info.generation)
    # A gzip object (Content-Encoding: gzip) was listed with its stored size;
    # its decoded bytes (what a read returns) have another length.
    if not info.transcoded:
        check_listed_size(store, info, len(data))
    return data
