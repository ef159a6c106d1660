"""An in-process object store: ``memory://name/key``.

Buckets live in a process-wide registry by name, so two ``MemoryStore("b")``
objects see the same data. A forked DataLoader worker sees a copy of the parent's
buckets as they were at the fork; a spawned one starts with empty buckets. It is
meant for unit tests and examples; the conformance suite holds it to the same
behaviour as GCS.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from torchbucket.errors import (
    BucketExistsError,
    BucketNotFoundError,
    IntegrityError,
    NotFoundError,
    PreconditionFailedError,
    StorageError,
)
from torchbucket.runtime import accounting
from torchbucket.storage._common import (
    check_compose_sources,
    check_page_size,
    check_part_number,
    resolve_range,
)
from torchbucket.storage.base import (
    ListPage,
    MultipartUpload,
    ObjectInfo,
    Part,
    PartData,
    part_pieces,
)
from torchbucket.storage.crc32c import b64, crc32c_b64

__all__ = ["MemoryStore", "delete_memory_bucket"]


@dataclass
class _Object:
    data: bytes
    info: ObjectInfo


@dataclass
class _Upload:
    key: str
    initiated: float
    parts: dict[int, bytes] = field(default_factory=dict)


@dataclass
class _Bucket:
    objects: dict[str, _Object] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)  # sorted
    uploads: dict[str, _Upload] = field(default_factory=dict)


_registry: dict[str, _Bucket] = {}
_registry_lock = threading.Lock()
_generations = itertools.count(int(time.time() * 1_000_000))


def delete_memory_bucket(name: str) -> None:
    """Forget an in-memory bucket and everything in it."""
    with _registry_lock:
        _registry.pop(name, None)


class MemoryStore:
    """An object store held in this process's memory.

    Args:
        bucket: Bucket name. Created empty on first use when ``create`` is true.
        create: Create the bucket if it does not exist. When false, operations on
            a missing bucket raise ``BucketNotFoundError``.
    """

    def __init__(self, bucket: str, *, create: bool = True) -> None:
        self._bucket = bucket
        self._create = create
        if create:
            with _registry_lock:
                _registry.setdefault(bucket, _Bucket())

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self._bucket,), {"_create": self._create})

    def __repr__(self) -> str:
        return f"MemoryStore({self._bucket!r})"

    @property
    def bucket(self) -> str:
        return self._bucket

    def uri(self, key: str = "") -> str:
        return f"memory://{self._bucket}/{key}"

    async def create_bucket(
        self, *, project: str | None = None, location: str | None = None
    ) -> None:
        """Create the bucket (``project`` and ``location`` are ignored).

        A store made with ``create=True`` (the default) has made it already.

        Raises:
            BucketExistsError: It exists.
        """
        with _registry_lock:
            if self._bucket in _registry:
                raise BucketExistsError(
                    "bucket already exists", operation="create bucket", uri=self.uri()
                )
            _registry[self._bucket] = _Bucket()

    def _data(self, operation: str) -> _Bucket:
        bucket = _registry.get(self._bucket)
        if bucket is None:
            if self._create:
                with _registry_lock:
                    return _registry.setdefault(self._bucket, _Bucket())
            raise BucketNotFoundError("bucket does not exist", operation=operation, uri=self.uri())
        return bucket

    def _object(self, key: str, operation: str, generation: int | None = None) -> _Object:
        obj = self._data(operation).objects.get(key)
        if obj is None or (generation is not None and obj.info.generation != generation):
            what = "object does not exist" if obj is None else f"generation {generation} is gone"
            raise NotFoundError(what, operation=operation, uri=self.uri(key))
        return obj

    def _store(
        self, key: str, data: bytes, operation: str, if_generation_match: int | None
    ) -> ObjectInfo:
        bucket = self._data(operation)
        current = bucket.objects.get(key)
        if if_generation_match is not None:
            have = current.info.generation if current is not None else 0
            if have != if_generation_match:
                raise PreconditionFailedError(
                    f"generation is {have}, expected {if_generation_match}",
                    operation=operation,
                    uri=self.uri(key),
                    status=412,
                )
        info = ObjectInfo(
            name=key,
            size=len(data),
            generation=next(_generations),
            crc32c=crc32c_b64(data),
            storage_class="STANDARD",
        )
        if current is None:
            bisect.insort(bucket.names, key)
        bucket.objects[key] = _Object(data, info)
        return info

    async def list_page(
        self,
        prefix: str = "",
        *,
        start_offset: str | None = None,
        end_offset: str | None = None,
        page_token: str | None = None,
        page_size: int = 1000,
    ) -> ListPage:
        check_page_size(page_size)
        accounting.count("list")
        bucket = self._data("list")
        names = bucket.names
        lower = max(prefix, start_offset or "")
        i = bisect.bisect_left(names, lower)
        if page_token is not None:
            i = max(i, bisect.bisect_right(names, page_token))
        out: list[ObjectInfo] = []
        while i < len(names) and len(out) < page_size:
            name = names[i]
            if not name.startswith(prefix) or (end_offset is not None and name >= end_offset):
                break
            out.append(bucket.objects[name].info)
            i += 1
        more = (
            i < len(names)
            and names[i].startswith(prefix)
            and (end_offset is None or names[i] < end_offset)
        )
        await asyncio.sleep(0)
        return ListPage(out, out[-1].name if more and out else None)

    async def list_folder(
        self, prefix: str, *, page_token: str | None = None, page_size: int = 1000
    ) -> ListPage:
        check_page_size(page_size)
        accounting.count("list")
        bucket = self._data("list")
        names = bucket.names
        i = bisect.bisect_left(names, prefix)
        if page_token is not None:
            # Past the token, and past every name in it when it is a folder.
            after = page_token[:-1] + "0" if page_token.endswith("/") else page_token + "\0"
            i = max(i, bisect.bisect_left(names, after))
        objects: list[ObjectInfo] = []
        folders: list[str] = []
        last: str | None = None
        while i < len(names) and names[i].startswith(prefix):
            if len(objects) + len(folders) == page_size:
                return ListPage(objects, last, folders)
            name = names[i]
            slash = name.find("/", len(prefix))
            if slash < 0:
                objects.append(bucket.objects[name].info)
                last = name
                i += 1
            else:
                last = name[: slash + 1]
                folders.append(last)
                i = bisect.bisect_left(names, name[:slash] + "0", i)  # "0" follows "/"
        await asyncio.sleep(0)
        return ListPage(objects, None, folders)

    async def head(self, key: str) -> ObjectInfo:
        accounting.count("head")
        return self._object(key, "head").info

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, generation: int | None = None
    ) -> bytes:
        accounting.count("get")
        obj = self._object(key, "get", generation)
        lo, hi = resolve_range(len(obj.data), start, end)
        accounting.received(max(0, hi - lo))
        await asyncio.sleep(0)
        return obj.data[lo:hi]

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        data = await self.get(key, start=start, end=start + len(buffer), generation=generation)
        buffer[: len(data)] = data
        return len(data)

    async def stream(
        self, key: str, *, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        data = await self.get(key, start=start, end=end)
        for offset in range(0, len(data), chunk_size):
            yield data[offset : offset + chunk_size]
            await asyncio.sleep(0)

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_generation_match: int | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        accounting.count("put", len(data))
        return self._store(key, bytes(data), "put", if_generation_match)

    async def put_stream(
        self, key: str, chunks: AsyncIterator[bytes], *, content_type: str | None = None
    ) -> ObjectInfo:
        parts = [bytes(chunk) async for chunk in chunks]
        accounting.count("put", sum(map(len, parts)))
        return self._store(key, b"".join(parts), "put", None)

    async def compose(
        self,
        destination: str,
        sources: Sequence[ObjectInfo],
        *,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        check_compose_sources(sources)
        accounting.count("compose")
        parts = [self._object(s.name, "compose", s.generation).data for s in sources]
        return self._store(destination, b"".join(parts), "compose", if_generation_match)

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        accounting.count("delete")
        bucket = self._data("delete")
        self._object(key, "delete", generation)
        del bucket.objects[key]
        i = bisect.bisect_left(bucket.names, key)
        del bucket.names[i]

    async def copy(
        self, source: str, destination: str, *, source_generation: int | None = None
    ) -> ObjectInfo:
        accounting.count("copy")
        data = self._object(source, "copy", source_generation).data
        return self._store(destination, data, "copy", None)

    async def multipart_initiate(self, key: str, *, content_type: str | None = None) -> str:
        accounting.count("mpu_initiate")
        upload_id = uuid.uuid4().hex
        self._data("multipart initiate").uploads[upload_id] = _Upload(key, time.time())
        return upload_id

    def _upload(self, key: str, upload_id: str, operation: str) -> _Upload:
        upload = self._data(operation).uploads.get(upload_id)
        if upload is None or upload.key != key:
            raise NotFoundError(
                f"no multipart upload {upload_id!r}", operation=operation, uri=self.uri(key)
            )
        return upload

    async def multipart_upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: PartData,
        *,
        crc32c: int | None = None,
    ) -> Part:
        check_part_number(number)
        data = b"".join(part_pieces(data)) if isinstance(data, list) else data
        accounting.count("mpu_part", len(data))
        upload = self._upload(key, upload_id, "multipart upload part")
        etag = crc32c_b64(data)
        if crc32c is not None and b64(crc32c) != etag:
            # As GCS refuses a part that does not match its declared hash.
            raise IntegrityError(
                f"part {number} declares CRC32C {b64(crc32c)}, its bytes have {etag}",
                operation="multipart upload part",
                uri=self.uri(key),
                status=400,
            )
        upload.parts[number] = bytes(data)
        await asyncio.sleep(0)
        return Part(number, etag)

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        accounting.count("mpu_complete")
        upload = self._upload(key, upload_id, "multipart complete")
        numbers = [p.number for p in parts]
        if not numbers or numbers != sorted(set(numbers)):
            raise StorageError(
                "parts must be given in ascending order of number, without repeats",
                operation="multipart complete",
                uri=self.uri(key),
                status=400,
            )
        chunks = []
        for part in parts:
            data = upload.parts.get(part.number)
            if data is None or crc32c_b64(data) != part.etag:
                raise StorageError(
                    f"part {part.number} was not uploaded or its etag differs",
                    operation="multipart complete",
                    uri=self.uri(key),
                    status=400,
                )
            chunks.append(data)
        info = self._store(key, b"".join(chunks), "multipart complete", None)
        del self._data("multipart complete").uploads[upload_id]
        return info

    async def multipart_abort(self, key: str, upload_id: str) -> None:
        accounting.count("mpu_abort")
        self._upload(key, upload_id, "multipart abort")
        del self._data("multipart abort").uploads[upload_id]

    async def multipart_list(self, prefix: str = "") -> list[MultipartUpload]:
        accounting.count("mpu_list")
        uploads = self._data("multipart list").uploads
        return sorted(
            (
                MultipartUpload(u.key, upload_id, u.initiated)
                for upload_id, u in uploads.items()
                if u.key.startswith(prefix)
            ),
            key=lambda u: (u.key, u.upload_id),
        )

    async def close(self) -> None:
        return None
