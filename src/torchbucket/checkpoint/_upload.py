"""The async side of a checkpoint save: parts go up while ``torch.save`` writes.

The synchronous writer (:mod:`._writer`) fills part buffers and hands each full
one to an upload session with :meth:`start_part`, called on the background loop
through ``call_soon_threadsafe``. A session tracks its tasks so that an abort
can cancel them and wait until no request still reads a buffer before the
buffer is reused. Every part calls ``release`` when the store is done with its
buffer, success or not.

Where the multipart API is refused or missing (the initiate answered 403, 404,
405 or 501: an endpoint without GCS's XML API, or a policy that forbids it), a
multipart session falls back to one resumable upload of the same parts, in
order, with one WARNING; the bucket is remembered for the process, so later
saves there go resumable at once (:func:`open_session`) and do not list
multipart uploads (:func:`list_stale_candidates`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from torchbucket.errors import BucketNotFoundError, StorageError
from torchbucket.runtime.tasks import cancel_and_wait
from torchbucket.storage.base import MultipartUpload, ObjectInfo, ObjectStore, Part, PartData
from torchbucket.storage.capabilities import RemoteStore, SupportsZonal

__all__ = [
    "MultipartSession",
    "StreamSession",
    "UploadSession",
    "list_stale_candidates",
    "multipart_refused",
    "open_session",
]

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/octet-stream"

Release = Callable[[], None]

#: Statuses of a multipart request that mean "not here": forbidden (403), no
#: such API (404, 405) or not implemented (501). None of them is retried.
_REFUSED_STATUSES = frozenset({403, 404, 405, 501})

#: Buckets (endpoint and bucket URI) where multipart upload was refused or is
#: missing, in this process.
_no_multipart: set[str] = set()


def _bucket_key(store: ObjectStore) -> str:
    endpoint = store.endpoint if isinstance(store, RemoteStore) else ""
    return f"{endpoint} {store.uri()}"


def multipart_refused(exc: BaseException) -> bool:
    """Whether ``exc``, from a multipart request, says the API is not available.

    A missing bucket is not that: it fails every upload method alike.
    """
    return (
        isinstance(exc, StorageError)
        and not isinstance(exc, BucketNotFoundError)
        and exc.status in _REFUSED_STATUSES
    )


async def _note_refused(store: ObjectStore, exc: StorageError) -> None:
    key = _bucket_key(store)
    if key in _no_multipart:
        return
    _no_multipart.add(key)
    if isinstance(store, SupportsZonal) and await store.zonal():
        # Expected there, not a misconfiguration: a zonal bucket has none.
        logger.info(
            "%s is a zonal bucket, which has no multipart upload: checkpoints there are "
            "streamed into one appendable object",
            store.uri(),
        )
        return
    logger.warning(
        "multipart upload is refused or not implemented on %s (%s); checkpoints there are "
        "saved by resumable upload from now on in this process (set "
        "CheckpointConfig(upload_method='resumable') to say so and silence this)",
        store.uri(),
        exc,
    )


def open_session(
    store: ObjectStore, key: str, upload_method: str, content_type: str = CONTENT_TYPE
) -> UploadSession:
    """The upload session for a save of ``key`` by ``upload_method``.

    ``"multipart"`` on a bucket known (in this process) to lack multipart upload
    gives a resumable session at once. The object is stored as ``content_type``.
    """
    if upload_method == "multipart" and _bucket_key(store) not in _no_multipart:
        return MultipartSession(store, key, content_type)
    return StreamSession(store, key, content_type)


async def list_stale_candidates(store: ObjectStore, key: str) -> list[MultipartUpload]:
    """The multipart uploads to ``key``, to abort stale ones after a save.

    Empty, without a request, on a bucket known to lack multipart upload; a
    listing answered as by such a bucket marks it so (one WARNING) and is empty.

    Raises:
        StorageError: The listing failed otherwise.
    """
    if _bucket_key(store) in _no_multipart:
        return []
    try:
        return await store.multipart_list(key)
    except StorageError as exc:
        if not multipart_refused(exc):
            raise
        await _note_refused(store, exc)
        return []


class UploadSession:
    """What the writer needs from an upload, whatever the method."""

    def __init__(self, store: ObjectStore, key: str, content_type: str = CONTENT_TYPE) -> None:
        self.store = store
        self.key = key
        self.uri = store.uri(key)
        #: The object's ``Content-Type``.
        self.content_type = content_type
        #: The first failure of a part, read by the writer thread.
        self.error: BaseException | None = None

    def start_part(
        self, number: int, view: PartData, release: Release, crc32c: int | None = None
    ) -> None:
        """Begin uploading part ``number``; call on the loop thread.

        ``crc32c`` is the part's CRC32C where the caller has it (the part then
        declares it rather than being checksummed again).
        """
        raise NotImplementedError

    async def finish(self) -> ObjectInfo:
        """Wait for every part and make the object visible."""
        raise NotImplementedError

    async def abort(self) -> None:
        """Stop every part and make sure nothing becomes visible."""
        raise NotImplementedError


class MultipartSession(UploadSession):
    """Parts uploaded in parallel through the store's multipart API.

    If the initiate says the API is not available (:func:`multipart_refused`),
    the parts go through one :class:`StreamSession` instead, in part order.
    """

    def __init__(self, store: ObjectStore, key: str, content_type: str = CONTENT_TYPE) -> None:
        self._error: BaseException | None = None
        self._stream: StreamSession | None = None
        super().__init__(store, key, content_type)
        self._initiate: asyncio.Task[str] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._parts: dict[int, Part] = {}
        # Parts waiting for their predecessors before they enter the stream.
        self._early: dict[int, tuple[PartData, Release]] = {}
        self._next_to_stream = 1

    @property  # type: ignore[override]
    def error(self) -> BaseException | None:
        """The first failure of a part (or of the fallback stream)."""
        if self._error is None and self._stream is not None:
            return self._stream.error
        return self._error

    @error.setter
    def error(self, value: BaseException | None) -> None:
        self._error = value

    @property
    def fell_back(self) -> bool:
        """Whether the parts went to a resumable upload instead."""
        return self._stream is not None

    def _to_stream(self, number: int, view: PartData, release: Release) -> None:
        """Hand part ``number`` to the fallback stream once all before it are there."""
        if self._stream is None:
            self._stream = StreamSession(self.store, self.key, self.content_type)
        self._early[number] = (view, release)
        while self._next_to_stream in self._early:
            item = self._early.pop(self._next_to_stream)
            self._stream.start_part(self._next_to_stream, *item)
            self._next_to_stream += 1

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
                self.store.multipart_initiate(self.key, content_type=self.content_type)
            )
        # Shielded: cancelling one part must not cancel the upload all parts share.
        return await asyncio.shield(self._initiate)

    def start_part(
        self, number: int, view: PartData, release: Release, crc32c: int | None = None
    ) -> None:
        if self._initiate is None:
            self._initiate = asyncio.ensure_future(
                self.store.multipart_initiate(self.key, content_type=self.content_type)
            )
        task = asyncio.ensure_future(self._part(number, view, release, crc32c))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _part(
        self, number: int, view: PartData, release: Release, crc32c: int | None
    ) -> None:
        handed_over = False
        try:
            try:
                upload_id = await self._upload_id()
            except StorageError as exc:
                if not multipart_refused(exc):
                    raise
                await _note_refused(self.store, exc)
                self._to_stream(number, view, release)  # the stream releases it
                handed_over = True
                return
            part = await self.store.multipart_upload_part(
                self.key, upload_id, number, view, crc32c=crc32c
            )
            self._parts[number] = part
        except Exception as exc:
            # Kept for the writer, which raises it on its next call; not re-raised
            # here, where nobody would retrieve it.
            if self._error is None:
                self._error = exc
        finally:
            if not handed_over:
                release()

    async def finish(self) -> ObjectInfo:
        if self._tasks:
            await asyncio.gather(*list(self._tasks))
        if self._error is not None:
            raise self._error
        if self._stream is not None:
            return await self._stream.finish()
        upload_id = await self._upload_id()
        parts = [self._parts[n] for n in sorted(self._parts)]
        return await self.store.multipart_complete(self.key, upload_id, parts)

    async def abort(self) -> None:
        # Wait, so that no request still reads a buffer the writer will reuse;
        # their errors are the reason for the abort or a consequence of it.
        await cancel_and_wait(self._tasks)
        for _, release in self._early.values():
            release()
        self._early.clear()
        if self._stream is not None:
            await self._stream.abort()
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

    def __init__(self, store: ObjectStore, key: str, content_type: str = CONTENT_TYPE) -> None:
        super().__init__(store, key, content_type)
        self._queue: asyncio.Queue[tuple[PartData, Release] | None] = asyncio.Queue()
        self._task: asyncio.Task[ObjectInfo] | None = None
        self._aborted = False

    def _ensure_task(self) -> asyncio.Task[ObjectInfo]:
        if self._task is None:
            self._task = asyncio.ensure_future(
                self.store.put_stream(self.key, self._chunks(), content_type=self.content_type)
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
                chunk = b"".join(view) if isinstance(view, list) else bytes(view)
            finally:
                release()
            yield chunk

    def start_part(
        self, number: int, view: PartData, release: Release, crc32c: int | None = None
    ) -> None:
        del crc32c  # the stream declares the whole object's CRC32C, at its end
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
