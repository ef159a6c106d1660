"""A local directory tree as an object store: ``file:///path``.

The bucket is the filesystem root ``"/"`` and a key is an absolute path without
its leading ``/``, so ``file:///data/train/img_`` is a prefix like any other.

Writes are atomic: bytes go to a hidden temporary file in the destination's
directory, which is then renamed over the destination, so a reader sees the old
object or the new one, never half of one. An object's generation is its
modification time in nanoseconds, kept strictly increasing per object, so
generation pins and ``if_generation_match`` behave as on GCS within one host
(the check and the rename are not one atomic step across processes).

Multipart uploads stage their parts in a hidden sibling directory
``.<name>.tbupload-<id>/``; listings skip it, ``multipart_abort`` removes it.
CRC32C is reported for what ``put`` wrote, not by ``head`` or listings (it would
mean reading every file).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import os
import shutil
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from torchbucket.errors import (
    BucketExistsError,
    NotFoundError,
    StorageError,
)
from torchbucket.runtime import accounting
from torchbucket.storage import _localfs as _fs
from torchbucket.storage._common import (
    check_compose_sources,
    check_page_size,
    check_part_number,
    check_range,
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
from torchbucket.storage.crc32c import crc32c_b64

__all__ = ["LocalStore"]

T = TypeVar("T")

# Below this, file I/O runs on the loop: a thread hop costs more than the read.
_INLINE_BYTES = 256 * 1024
_LISTING_CACHE_S = 10.0


class LocalStore:
    """An :class:`~torchbucket.storage.base.ObjectStore` over the local filesystem."""

    def __init__(self) -> None:
        # prefix -> (time listed, sorted names, infos): later pages reuse one walk.
        self._listings: dict[str, tuple[float, list[str], dict[str, ObjectInfo]]] = {}

    def __reduce__(self) -> tuple[object, ...]:
        return (LocalStore, ())

    def __repr__(self) -> str:
        return "LocalStore()"

    @property
    def bucket(self) -> str:
        return "/"

    def uri(self, key: str = "") -> str:
        return _fs.uri(key)

    async def create_bucket(
        self, *, project: str | None = None, location: str | None = None
    ) -> None:
        """The bucket is the filesystem's root, which always exists.

        Raises:
            BucketExistsError: Always (make directories with ``mkdir``; a
                ``put`` makes the directories of its key).
        """
        raise BucketExistsError(
            "the local filesystem's root always exists", operation="create bucket", uri=self.uri()
        )

    async def _io(self, size: int, fn: Callable[[], T]) -> T:
        if size <= _INLINE_BYTES:
            return fn()
        return await asyncio.to_thread(fn)

    # ------------------------------------------------------------ metadata

    def _stat(self, key: str, operation: str) -> os.stat_result:
        try:
            st = os.stat(_fs.path_of(key))
        except OSError as exc:
            raise _fs.os_error(exc, operation, self.uri(key)) from exc
        if not stat.S_ISREG(st.st_mode):
            raise NotFoundError("object does not exist", operation=operation, uri=self.uri(key))
        return st

    async def head(self, key: str) -> ObjectInfo:
        accounting.count("head")
        return _fs.info(key, self._stat(key, "head"))

    # ------------------------------------------------------------ listing

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
        cached = self._listings.get(prefix)
        if page_token is not None and cached and time.monotonic() - cached[0] < _LISTING_CACHE_S:
            _, names, infos = cached
        else:
            infos = await asyncio.to_thread(_fs.walk, prefix)
            names = sorted(infos)
            self._listings[prefix] = (time.monotonic(), names, infos)
        i = bisect.bisect_left(names, max(prefix, start_offset or ""))
        if page_token is not None:
            i = max(i, bisect.bisect_right(names, page_token))
        stop = len(names) if end_offset is None else bisect.bisect_left(names, end_offset)
        page = names[i : min(stop, i + page_size)]
        more = i + page_size < stop
        if not more:
            self._listings.pop(prefix, None)
        return ListPage([infos[n] for n in page], page[-1] if more and page else None)

    # ------------------------------------------------------------ reads

    def _read(self, key: str, start: int, end: int | None, generation: int | None) -> bytes:
        uri = self.uri(key)
        try:
            with open(_fs.path_of(key), "rb") as f:
                st = os.fstat(f.fileno())
                _fs.check_generation(st, generation, "get", uri)
                lo, hi = resolve_range(st.st_size, start, end)
                return os.pread(f.fileno(), hi - lo, lo) if hi > lo else b""
        except OSError as exc:
            raise _fs.os_error(exc, "get", uri) from exc

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, generation: int | None = None
    ) -> bytes:
        check_range(start, end)
        accounting.count("get")
        size = (end - start) if end is not None else self._stat(key, "get").st_size - start
        data = await self._io(size, lambda: self._read(key, start, end, generation))
        accounting.received(len(data))
        return data

    def _read_into(self, key: str, buffer: memoryview, start: int, generation: int | None) -> int:
        uri = self.uri(key)
        try:
            with open(_fs.path_of(key), "rb") as f:
                _fs.check_generation(os.fstat(f.fileno()), generation, "get", uri)
                total = 0
                while total < len(buffer):
                    n = os.preadv(f.fileno(), [buffer[total:]], start + total)
                    if n == 0:
                        break
                    total += n
                return total
        except OSError as exc:
            raise _fs.os_error(exc, "get", uri) from exc

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        check_range(start, None)
        accounting.count("get")
        n = await self._io(len(buffer), lambda: self._read_into(key, buffer, start, generation))
        accounting.received(n)
        return n

    async def stream(
        self, key: str, *, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        uri = self.uri(key)
        check_range(start, end)
        accounting.count("get")
        try:
            f = open(_fs.path_of(key), "rb")  # noqa: SIM115 - closed in finally
        except OSError as exc:
            raise _fs.os_error(exc, "stream", uri) from exc
        try:
            st = os.fstat(f.fileno())
            _fs.check_generation(st, None, "stream", uri)
            pos, stop = resolve_range(st.st_size, start, end)
            while pos < stop:
                n = min(chunk_size, stop - pos)
                chunk = await self._io(n, functools.partial(os.pread, f.fileno(), n, pos))
                if not chunk:
                    break
                pos += len(chunk)
                accounting.received(len(chunk))
                yield chunk
        except OSError as exc:
            raise _fs.os_error(exc, "stream", uri) from exc
        finally:
            f.close()

    # ------------------------------------------------------------ writes

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_generation_match: int | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        accounting.count("put", len(data))
        info = await self._io(
            len(data),
            lambda: _fs.commit(key, lambda fd: _fs.write_all(fd, data), "put", if_generation_match),
        )
        crc = crc32c_b64(data)
        return ObjectInfo(info.name, info.size, info.generation, crc, "STANDARD")

    async def put_stream(
        self, key: str, chunks: AsyncIterator[bytes], *, content_type: str | None = None
    ) -> ObjectInfo:
        # Chunks go straight into the hidden temporary file, which is then renamed
        # into place: memory stays at one chunk and the bytes are written once.
        uri = self.uri(key)
        path, tmp = _fs.target(key, "put")
        try:
            os.makedirs(path.rpartition("/")[0] or "/", exist_ok=True)
            spool = open(tmp, "xb")  # noqa: SIM115 - closed below on every path
        except OSError as exc:
            raise _fs.os_error(exc, "put", uri) from exc
        written = False
        try:
            sent = 0
            async for chunk in chunks:
                await self._io(len(chunk), functools.partial(spool.write, chunk))
                sent += len(chunk)
            written = True
            accounting.count("put", sent)
        finally:
            spool.close()
            if not written:
                _fs.unlink_quietly(tmp)
        try:
            return await asyncio.to_thread(_fs.install, key, tmp, "put", None)
        except OSError as exc:
            raise _fs.os_error(exc, "put", uri) from exc

    async def compose(
        self,
        destination: str,
        sources: Sequence[ObjectInfo],
        *,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        check_compose_sources(sources)
        accounting.count("compose")

        def write(fd: int) -> None:
            for source in sources:
                uri = self.uri(source.name)
                with open(_fs.path_of(source.name), "rb") as src:
                    st = os.fstat(src.fileno())
                    _fs.check_generation(st, source.generation, "compose", uri)
                    offset = 0
                    while offset < st.st_size:
                        sent = os.sendfile(fd, src.fileno(), offset, st.st_size - offset)
                        if sent == 0:
                            break
                        offset += sent

        return await asyncio.to_thread(
            _fs.commit, destination, write, "compose", if_generation_match
        )

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        accounting.count("delete")
        uri = self.uri(key)
        try:
            if generation is not None:
                _fs.check_generation(os.stat(_fs.path_of(key)), generation, "delete", uri)
            else:
                self._stat(key, "delete")
            os.unlink(_fs.path_of(key))
        except OSError as exc:
            raise _fs.os_error(exc, "delete", uri) from exc

    async def copy(
        self, source: str, destination: str, *, source_generation: int | None = None
    ) -> ObjectInfo:
        accounting.count("copy")
        uri = self.uri(source)
        self._stat(source, "copy")

        def pinned() -> ObjectInfo:
            try:
                src = open(_fs.path_of(source), "rb")  # noqa: SIM115 - closed by the with below
            except OSError as exc:
                raise _fs.os_error(exc, "copy", uri) from exc
            with src:
                # The open file's generation: a file renamed over the name
                # after this check is not what is copied.
                _fs.check_generation(os.fstat(src.fileno()), source_generation, "copy", uri)
                return _fs.commit(destination, _fs.sender(src.fileno()), "copy")

        return await asyncio.to_thread(pinned)

    # ------------------------------------------------------------ multipart

    async def multipart_initiate(self, key: str, *, content_type: str | None = None) -> str:
        accounting.count("mpu_initiate")
        if not key or key.endswith("/"):
            raise StorageError(
                "not an object name", operation="multipart initiate", uri=self.uri(key)
            )
        upload_id = uuid.uuid4().hex[:16]
        try:
            os.makedirs(_fs.staging(key, upload_id))
        except OSError as exc:
            raise _fs.os_error(exc, "multipart initiate", self.uri(key)) from exc
        return upload_id

    def _existing_staging(self, key: str, upload_id: str, operation: str) -> str:
        path = _fs.staging(key, upload_id)
        if "/" in upload_id or not os.path.isdir(path):
            raise NotFoundError(
                f"no multipart upload {upload_id!r}", operation=operation, uri=self.uri(key)
            )
        return path

    async def multipart_upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: PartData,
        *,
        crc32c: int | None = None,  # nothing in transit here: written as given
    ) -> Part:
        check_part_number(number)
        pieces = part_pieces(data)
        size = sum(len(piece) for piece in pieces)
        accounting.count("mpu_part", size)
        staging = self._existing_staging(key, upload_id, "multipart upload part")
        part_key = f"{staging[1:]}/part-{number:05d}"

        def write(fd: int) -> None:
            for piece in pieces:
                _fs.write_all(fd, piece)

        info = await self._io(size, lambda: _fs.commit(part_key, write, "multipart upload part"))
        return Part(number, _fs.part_etag(info.size, info.generation))

    async def multipart_complete(
        self, key: str, upload_id: str, parts: Sequence[Part]
    ) -> ObjectInfo:
        operation = "multipart complete"
        accounting.count("mpu_complete")
        uri = self.uri(key)
        staging = self._existing_staging(key, upload_id, operation)
        numbers = [p.number for p in parts]
        if not numbers or numbers != sorted(set(numbers)):
            raise StorageError(
                "parts must be given in ascending order of number, without repeats",
                operation=operation,
                uri=uri,
                status=400,
            )
        paths = [f"{staging}/part-{p.number:05d}" for p in parts]

        def check_and_commit() -> ObjectInfo:
            for part, path in zip(parts, paths):
                try:
                    st = os.stat(path)
                    etag: str | None = _fs.part_etag(st.st_size, st.st_mtime_ns)
                except FileNotFoundError:
                    etag = None
                if etag != part.etag:
                    raise StorageError(
                        f"part {part.number} was not uploaded or its etag differs",
                        operation=operation,
                        uri=uri,
                        status=400,
                    )
            info = _fs.commit(key, _fs.copier(*paths), operation)
            shutil.rmtree(staging, ignore_errors=True)
            return info

        return await asyncio.to_thread(check_and_commit)

    async def multipart_abort(self, key: str, upload_id: str) -> None:
        accounting.count("mpu_abort")
        staging = self._existing_staging(key, upload_id, "multipart abort")
        await asyncio.to_thread(shutil.rmtree, staging)

    async def multipart_list(self, prefix: str = "") -> list[MultipartUpload]:
        accounting.count("mpu_list")
        uploads = await asyncio.to_thread(lambda: list(_fs.walk_uploads(prefix)))
        return sorted(uploads, key=lambda u: (u.key, u.upload_id))

    async def close(self) -> None:
        self._listings.clear()
