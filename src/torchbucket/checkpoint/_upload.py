"""The async side of a checkpoint save: parts go up while ``torch.save`` writes.

The synchronous writer (:mod:`._writer`) fills part buffers and hands each full
one to an upload session with :meth:`start_part`, called on the background loop
through ``call_soon_threadsafe``. A session tracks its tasks so that an abort
can cancel them and wait until no request still reads a buffer before the
buffer is reused. Every part calls ``release`` when the store is done with its
buffer, success or not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from torchbucket.errors import StorageError
from torchbucket.storage.base import ObjectInfo, ObjectStore, Part

__all__ = ["MultipartSession", "StreamSession", "UploadSession"]

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/octet-stream"

Release = Callable[[], None]


class UploadSession:
    """What the writer needs from an upload, whatever the method."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.store = store
        self.key = key
        self.uri = store.uri(key)
        #: The first failure of a part, read by the writer thread.
        self.error: BaseException | None = None

    def start_part(self, number: int, view: memoryview, release: Release) -> None:
        """Begin uploading part ``number``; call on the loop thread."""
        raise NotImplementedError

    async def finish(self) -> ObjectInfo:
        """Wait for every part and make the object visible."""
        raise NotImplementedError

    async def abort(self) -> None:
        """Stop every part and make sure nothing becomes visible."""
        raise NotImplementedError


class MultipartSession(UploadSession):
    """Parts uploaded in parallel through the store's multipart API."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__(store, key)
        self._initiate: asyncio.Task[str] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._parts: dict[int, Part] = {}

    @property
    def upload_id(self) -> str | None:
        """The store's id of the upload, once it has been initiated."""
        task = self._initiate
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    async def _upload_id(self) -> str:
        if self._initiate is None:
            self._initiate = asyncio.ensure_future(
                self.store.multipart_initiate(self.key, content_type=CONTENT_TYPE)
            )
        # Shielded: cancelling one part must not cancel the upload all parts share.
        return await asyncio.shield(self._initiate)

    def start_part(self, number: int, view: memoryview, release: Release) -> None:
        if self._initiate is None:
            self._initiate = asyncio.ensure_future(
                self.store.multipart_initiate(self.key, content_type=CONTENT_TYPE)
            )
        task = asyncio.ensure_future(self._part(number, view, release))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _part(self, number: int, view: memoryview, release: Release) -> None:
        try:
            upload_id = await self._upload_id()
            part = await self.store.multipart_upload_part(self.key, upload_id, number, view)
            self._parts[number] = part
        except Exception as exc:
            # Kept for the writer, which raises it on its next call; not re-raised
            # here, where nobody would retrieve it.
            if self.error is None:
                self.error = exc
        finally:
            release()

    async def finish(self) -> ObjectInfo:
        if self._tasks:
            await asyncio.gather(*list(self._tasks))
        if self.error is not None:
            raise self.error
        upload_id = await self._upload_id()
        parts = [self._parts[n] for n in sorted(self._parts)]
        return await self.store.multipart_complete(self.key, upload_id, parts)

    async def abort(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Wait, so that no request still reads a buffer the writer will reuse;
        # their errors are the reason for the abort or a consequence of it.
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._initiate is None:
            return
        try:
            upload_id = await self._initiate
        except StorageError:
            return  # never initiated: nothing exists to abort
        await self.store.multipart_abort(self.key, upload_id)


class _Aborted(StorageError):
    """Raised into a streaming upload to make the store drop it."""


class StreamSession(UploadSession):
    """Parts sent in order through one streaming (resumable) upload."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__(store, key)
        self._queue: asyncio.Queue[tuple[memoryview, Release] | None] = asyncio.Queue()
        self._task: asyncio.Task[ObjectInfo] | None = None
        self._aborted = False

    def _ensure_task(self) -> asyncio.Task[ObjectInfo]:
        if self._task is None:
            self._task = asyncio.ensure_future(
                self.store.put_stream(self.key, self._chunks(), content_type=CONTENT_TYPE)
            )
            self._task.add_done_callback(self._note_failure)
        return self._task

    def _note_failure(self, task: asyncio.Task[ObjectInfo]) -> None:
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()
        # A failed upload asks for no more chunks: free what is still queued.
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                item[1]()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._queue.get()
            if item is None:
                if self._aborted:
                    raise _Aborted("save aborted", operation="checkpoint save", uri=self.uri)
                return
            view, release = item
            try:
                # A copy: a streaming upload may keep a chunk after asking for the next.
                chunk = bytes(view)
            finally:
                release()
            yield chunk

    def start_part(self, number: int, view: memoryview, release: Release) -> None:
        task = self._ensure_task()
        if task.done():
            release()
            return
        self._queue.put_nowait((view, release))

    async def finish(self) -> ObjectInfo:
        task = self._ensure_task()
        self._queue.put_nowait(None)
        return await task

    async def abort(self) -> None:
        if self._task is None:
            return
        self._aborted = True
        self._queue.put_nowait(None)
        try:
            await self._task
        except StorageError:
            # _Aborted, or the failure that led to the abort: nothing became
            # visible either way, since the stream never ended normally.
            return
