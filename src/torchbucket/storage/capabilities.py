"""What a store may have beyond :class:`~torchbucket.storage.base.ObjectStore`.

Each optional feature is a runtime-checkable protocol: code above the seam asks
``isinstance(store, SupportsSoftDelete)`` and then calls the method, typed,
instead of probing a store for an attribute. The conformance suite
(``tests/conformance/test_store_capabilities.py``) checks every backend claims
exactly the protocols listed below and runs each protocol on every backend that
claims it.

==========================  ======  =====  =====
protocol                    memory  local  GCS
==========================  ======  =====  =====
SupportsBuckets             yes     yes    yes
SupportsFolders             yes     no     yes
SupportsBucketInfo          no      no     yes
SupportsSoftDelete          no      no     yes
SupportsCreationTime        no      no     yes
UncheckedMultipartAssembly  no      no     yes
RemoteStore                 no      no     yes
SupportsZonal               no      no     yes
==========================  ======  =====  =====
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from torchbucket.config import RetryConfig
from torchbucket.storage.base import ListPage, ObjectInfo

__all__ = [
    "RemoteStore",
    "SupportsBucketInfo",
    "SupportsBuckets",
    "SupportsCheckedReads",
    "SupportsCreationTime",
    "SupportsFolders",
    "SupportsSoftDelete",
    "SupportsZonal",
    "UncheckedMultipartAssembly",
]


@runtime_checkable
class SupportsBuckets(Protocol):
    """A store that can create its own bucket (``torchbucket mb``).

    Optional: GCS, the in-memory store and the local filesystem have it.
    """

    async def create_bucket(
        self, *, project: str | None = None, location: str | None = None
    ) -> None:
        """Create the store's bucket.

        Args:
            project: The project that will own it, where the backend has
                projects (GCS); ``None`` for the backend's default.
            location: Where it is kept (a GCS location such as ``US`` or
                ``europe-west4``); ``None`` for the backend's default.

        Raises:
            BucketExistsError: The bucket exists already.
        """
        ...


@runtime_checkable
class SupportsFolders(Protocol):
    """A store that lists one level of a prefix's tree in one request.

    Optional: the parallel lister uses it, where a store has it, to list a
    prefix of folders (``train/<class>/...``) folder by folder instead of
    guessing where the folders' names lie in the key space.
    """

    async def list_folder(
        self, prefix: str, *, page_token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        """The objects directly under ``prefix`` and its folders, sorted.

        A folder is ``prefix`` plus a name's next segment up to and including
        its ``/`` (GCS's ``delimiter=/`` prefixes), in ``prefixes``. Objects
        and folders together fill at most ``page_size`` entries, as GCS counts
        them; the token is ``None`` on the last page.
        """
        ...


@runtime_checkable
class SupportsBucketInfo(Protocol):
    """A store that can ask the bucket itself whether it exists.

    Optional: ``torchbucket cleanup`` uses it to tell a missing bucket from an
    empty one. A store without it (memory, local) leaves that to its listing.
    """

    async def bucket_exists(self) -> bool | None:
        """Whether the bucket exists; ``None`` when the credentials may not tell."""
        ...


@runtime_checkable
class SupportsSoftDelete(Protocol):
    """A store whose bucket may keep deleted objects, billed, for a while.

    Optional: compose reads it before writing composites (see
    ``compose/_softdelete.py``), and ``torchbucket cost`` prices it. A store
    without it keeps nothing it deletes.
    """

    async def soft_delete_retention(self) -> int | None:
        """Seconds the bucket keeps deleted objects; 0 if none, ``None`` if unknown.

        Raises:
            BucketNotFoundError: The bucket does not exist.
        """
        ...


@runtime_checkable
class SupportsCreationTime(Protocol):
    """A store that can say when an object was written.

    Optional: ``torchbucket cleanup --older-than`` asks it of the leftovers it
    finds; a store without it has their age unknown, and spares them.
    """

    async def created(self, key: str, *, generation: int | None = None) -> float | None:
        """Seconds since the epoch when ``key`` (or its ``generation``) was written.

        Returns ``None`` where the store gives no time.

        Raises:
            NotFoundError: No such object (or generation).
        """
        ...


@runtime_checkable
class UncheckedMultipartAssembly(Protocol):
    """A store whose multipart completion nothing checks end to end.

    GCS checks each part but not the object a completion assembles, so a
    checkpoint writer assembles under a staging name and checks it before it
    takes the checkpoint's name (``checkpoint/_staging.py``). The memory and
    local stores assemble in process, where nothing is in transit.
    """

    @property
    def unchecked_multipart_assembly(self) -> bool:
        """True: an assembled object must be checked before it is trusted."""
        ...


@runtime_checkable
class RemoteStore(Protocol):
    """A store reached over the network: where its requests go, how they are retried.

    Optional: two GCS stores on different endpoints (Google's, an emulator's)
    may hold buckets of the same name, and a caller that repeats a whole
    operation (``torchbucket cp`` re-reading a stream that failed its
    checksum) follows the store's own retry budget.
    """

    @property
    def endpoint(self) -> str:
        """The base URL requests go to."""
        ...

    @property
    def retry(self) -> RetryConfig:
        """How the store's requests are retried."""
        ...


@runtime_checkable
class SupportsCheckedReads(Protocol):
    """A store whose reads may come with the server's checksum of every chunk.

    Optional: a checkpoint load asks it for each range, and where every range
    has one it checks the whole object's CRC32C by combining them rather than
    by reading the downloaded bytes again (GCS's gRPC path: each chunk arrives
    with its CRC32C and is checked against it on arrival).
    """

    async def get_into_checked(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> tuple[int, int | None]:
        """``get_into``, and the CRC32C of the bytes read, combined from the
        server's per-chunk checksums each checked on arrival (``None`` where
        this read had none)."""
        ...


@runtime_checkable
class SupportsZonal(Protocol):
    """A store whose bucket may be zonal (GCS Rapid storage).

    Optional: a zonal bucket has no compose, copy/rewrite or multipart upload,
    so compose turns itself off there (``compose/_softdelete.py``), with one
    INFO line, and small objects are read directly, each on a bidi stream of
    its own multiplexed on one connection. A store without it is not zonal.
    """

    async def zonal(self) -> bool:
        """Whether the bucket is zonal (or the store is told to treat it so).

        Asked of the bucket at most once per process.
        """
        ...

    async def zonal_orphans(
        self, prefix: str = "", *, older_than: float = 0.0, now: float | None = None
    ) -> list[tuple[ObjectInfo, float | None]]:
        """The data objects of a zonal save that no pointer names (a killed save's).

        ``torchbucket cleanup`` removes them. Those of keys under ``prefix``,
        last written at least ``older_than`` seconds ago (one of unknown age is
        then spared), each with that time; none on a regional bucket.
        """
        ...

    async def remove_zonal_orphans(
        self, orphans: Sequence[tuple[ObjectInfo, float | None]]
    ) -> tuple[int, int]:
        """Delete ``orphans`` that no pointer names still, each the generation listed.

        Returns:
            How many objects, and bytes, this call deleted.
        """
        ...
