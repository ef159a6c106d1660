"""The one seam to a backend: the async :class:`ObjectStore` protocol.

Everything above ``storage/`` talks to objects through this protocol only. A
backend maps its vendor errors onto :mod:`torchbucket.errors` and nothing else
does. Keys are object names inside the store's bucket; byte ranges are half-open
``[start, end)``.

Every method is a coroutine run on the process's background loop (see
:mod:`torchbucket.runtime`); synchronous code goes through ``runtime.run``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "COMPOSE_MAX_SOURCES",
    "HIDDEN_PREFIXES",
    "MULTIPART_MAX_PARTS",
    "TRANSCODED_ENCODINGS",
    "ListPage",
    "MultipartUpload",
    "ObjectInfo",
    "ObjectStore",
    "Part",
    "PartData",
    "part_pieces",
]

#: GCS composes at most 32 source objects into one.
COMPOSE_MAX_SOURCES = 32
#: GCS's XML multipart API (like S3's) accepts at most 10,000 parts.
MULTIPART_MAX_PARTS = 10_000
#: Object name prefixes that torchbucket itself writes and that listings skip:
#: composites, and the data objects of a zonal bucket's pointers (see
#: ``storage/gcs/_zonal.py``).
HIDDEN_PREFIXES = ("dataflux-composed-objects/", "torchbucket-zonal-objects/")
#: ``Content-Encoding`` values whose objects are read decoded: GCS serves a
#: ``gzip`` object decompressed ("decompressive transcoding",
#: https://cloud.google.com/storage/docs/transcoding), and torchbucket returns
#: the same bytes, as ``google-cloud-storage``'s ``download_as_bytes()`` does.
TRANSCODED_ENCODINGS = frozenset({"gzip"})

#: A multipart part's bytes: one buffer, or a list of them sent one after
#: another (a part gathered from where its bytes already are, without a copy).
PartData = bytes | bytearray | memoryview | list[memoryview]


def part_pieces(data: PartData) -> list[memoryview]:
    """A part's bytes (:data:`PartData`) as byte views, in order."""
    if isinstance(data, list):
        return [memoryview(piece).cast("B") for piece in data]
    return [memoryview(data).cast("B")]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows about one object.

    Attributes:
        name: The object's key inside its bucket.
        size: Size in bytes.
        generation: The object's generation (a version number that changes on
            every write), or ``None`` where a backend has none.
        crc32c: Base64 big-endian CRC32C as GCS reports it, or ``None``.
        storage_class: ``"STANDARD"``, ``"NEARLINE"``... or ``None``.
        content_encoding: The object's ``Content-Encoding`` metadata (``"gzip"``
            for an object GCS serves by decompressive transcoding), or ``None``.
            ``size`` and ``crc32c`` are those of the stored bytes; reads return
            the decoded bytes, whose length is known only once read (see
            :data:`TRANSCODED_ENCODINGS`).
    """

    name: str
    size: int
    generation: int | None = None
    crc32c: str | None = None
    storage_class: str | None = None
    content_encoding: str | None = None

    @property
    def transcoded(self) -> bool:
        """Whether reads return other bytes than the stored ones (gzip, decoded)."""
        return self.content_encoding in TRANSCODED_ENCODINGS


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing, in lexicographic (UTF-8 byte) order of name.

    Attributes:
        objects: The objects on this page.
        next_page_token: Token for the next page, ``None`` on the last page.
        prefixes: The folders on this page, from
            :meth:`~torchbucket.storage.capabilities.SupportsFolders.list_folder`
            (a plain listing has none).
    """

    objects: list[ObjectInfo]
    next_page_token: str | None = None
    prefixes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Part:
    """An uploaded part of a multipart upload.

    Attributes:
        number: 1-based part number.
        etag: What the store returned for the part.
    """

    number: int
    etag: str


@dataclass(frozen=True, slots=True)
class MultipartUpload:
    """An incomplete multipart upload.

    Attributes:
        key: The object the upload will create.
        upload_id: The store's id of the upload.
        initiated: Seconds since the epoch when it began, if known.
    """

    key: str
    upload_id: str
    initiated: float | None = field(default=None)


@runtime_checkable
class ObjectStore(Protocol):
    """An async object store holding one bucket.

    Implementations: :class:`~torchbucket.storage.gcs.GCSStore`,
    :class:`~torchbucket.storage.memory.MemoryStore`,
    :class:`~torchbucket.storage.local.LocalStore`. A store pickles as its
    configuration, so it can be handed to spawned DataLoader workers. What a
    store may have beyond this is in :mod:`torchbucket.storage.capabilities`.
    """

    @property
    def bucket(self) -> str:
        """The bucket name (``"/"`` for the local filesystem)."""
        ...

    def uri(self, key: str = "") -> str:
        """The URI of ``key`` in this store, for messages and for users."""
        ...

    async def list_page(
        self,
        prefix: str = "",
        *,
        start_offset: str | None = None,
        end_offset: str | None = None,
        page_token: str | None = None,
        page_size: int = 1000,
    ) -> ListPage:
        """List one page of objects whose names start with ``prefix``.

        Args:
            prefix: Only names that start with this.
            start_offset: Only names ``>= start_offset``.
            end_offset: Only names ``< end_offset``.
            page_token: Continue after a previous page.
            page_size: At most this many objects (a backend may return fewer).

        Raises:
            BucketNotFoundError: The bucket does not exist.
        """
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Metadata of one object.

        Raises:
            NotFoundError: No such object.
        """
        ...

    async def get(
        self,
        key: str,
        *,
        start: int = 0,
        end: int | None = None,
        generation: int | None = None,
    ) -> bytes:
        """Read the whole object or the range ``[start, end)``.

        A whole-object read is verified against the object's CRC32C where the
        backend reports one; a range read is verified against its length. A range
        that runs past the end of the object is cut at the end.

        Args:
            key: The object.
            start: First byte.
            end: One past the last byte, or ``None`` for the end of the object.
            generation: Read this generation only; ``NotFoundError`` if the object
                has been rewritten since.

        Raises:
            NotFoundError: No such object (or generation).
            IntegrityError: The bytes did not match the checksum or length.
        """
        ...

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        """Read ``len(buffer)`` bytes from ``start`` into ``buffer``.

        Filling a caller's buffer avoids a copy and lets large reads be split
        into parallel ranges that land in one allocation.

        Returns:
            The number of bytes read (less than ``len(buffer)`` only at the end
            of the object).
        """
        ...

    def stream(
        self, key: str, *, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        """Yield the object's bytes (or a range of them) in chunks as they arrive."""
        ...

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_generation_match: int | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Write a whole object at once; it becomes visible only when complete.

        Args:
            key: The object.
            data: Its bytes.
            if_generation_match: Write only if the current generation is this;
                ``0`` means "only if the object does not exist".
            content_type: MIME type; a backend default when ``None``.

        Raises:
            PreconditionFailedError: ``if_generation_match`` did not hold.
        """
        ...

    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Write an object from a stream of chunks (a resumable upload on GCS).

        The object becomes visible only after the last chunk; if the iterator
        raises, nothing becomes visible.
        """
        ...

    async def compose(
        self,
        destination: str,
        sources: Sequence[ObjectInfo],
        *,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        """Concatenate up to 32 source objects into ``destination``, server-side.

        Sources with a ``generation`` are pinned to it: if one was rewritten the
        compose fails with ``NotFoundError`` or ``PreconditionFailedError``.

        Raises:
            ValueError: No sources, or more than :data:`COMPOSE_MAX_SOURCES`.
        """
        ...

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        """Delete an object (or one generation of it).

        Raises:
            NotFoundError: No such object.
        """
        ...

    async def copy(
        self, source: str, destination: str, *, source_generation: int | None = None
    ) -> ObjectInfo:
        """Copy an object inside the bucket.

        Args:
            source: The object copied.
            destination: Where the copy goes (replaced if it exists).
            source_generation: Copy this generation of ``source`` only: one
                that has been replaced since is not copied.

        Raises:
            NotFoundError: No such object (or generation).
        """
        ...

    async def multipart_initiate(self, key: str, *, content_type: str | None = None) -> str:
        """Begin a multipart upload to ``key`` and return its upload id."""
        ...

    async def multipart_upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: PartData,
        *,
        crc32c: int | None = None,
    ) -> Part:
        """Upload part ``number`` (1-based, at most 10,000) of an upload.

        ``data`` is one buffer or a list of them, the part's bytes in order.

        ``crc32c``, the CRC32C of ``data`` where the caller has it already, is
        what the part declares instead of one computed again; a store that
        checks parts refuses one that does not match.
        """
        ...

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        """Assemble the parts, in order of number, into the object."""
        ...

    async def multipart_abort(self, key: str, upload_id: str) -> None:
        """Abandon an upload and free its parts; nothing becomes visible."""
        ...

    async def multipart_list(self, prefix: str = "") -> list[MultipartUpload]:
        """The incomplete multipart uploads whose keys start with ``prefix``."""
        ...

    async def close(self) -> None:
        """Release connections; the store may be used again afterwards."""
        ...
