"""The writable file object a checkpoint is saved through.

``torch.save`` (or anything that writes a file object) writes into parts:
copied into pool buffers, or, for the tensors ``BucketCheckpoint.save`` lends
it, taken as views of their memory (:mod:`._gather`). Each full part is
checksummed once (CRC32C, which it declares to the store), handed to the
background loop and uploads while the next one fills. When
``parts_in_flight`` parts are pending, ``write`` blocks until one finishes,
so memory stays under ``(parts_in_flight + 1) * part_size``.

Closing the writer normally commits: the last part goes up and the upload
completes, so the object appears whole, at once. Leaving a ``with`` block by an
exception, calling :meth:`CheckpointWriter.abort`, or losing the writer without
closing it aborts: nothing becomes visible and no incomplete upload is left.

Integrity: every request that carries the checkpoint's bytes declares their
CRC32C, so GCS refuses damaged bytes before anything becomes visible (a simple
upload's metadata, each multipart part's ``x-goog-hash``, a resumable upload's
finalizing request). What GCS does not check is the object a multipart
completion assembles from checked parts; so on GCS a multipart save is
assembled under a hidden staging name next to the checkpoint, its size and
CRC32C are compared with everything written, and only then is it copied onto
the checkpoint (:mod:`._staging`). A mismatch raises
:class:`~torchbucket.errors.IntegrityError` after the staged object is deleted,
and the previous checkpoint is still the one ``load`` returns. After any failed
save the previous checkpoint is untouched. (On the memory and local stores,
which assemble in process, the finished object is compared with what was
written the same way.)

Uncertain outcomes: the store resolves a simple or resumable upload whose
answers were lost by the object itself (it holds exactly what was sent, or the
write is repeated pinned to the generation seen). A multipart completion is
resolved here, where the CRC32C of the whole object is known: if completing
fails without a definite answer, the object is read, and the save succeeded if
it holds what was written (size and CRC32C).
"""

from __future__ import annotations

import functools
import io
import logging
import threading
import warnings
from types import TracebackType
from typing import Literal

from torchbucket import runtime
from torchbucket.checkpoint._cleanup import abort_stale_after_save
from torchbucket.checkpoint._gather import LEND_MIN, PartBuilder
from torchbucket.checkpoint._lent import LentMemory
from torchbucket.checkpoint._parts import (
    BufferPool,
    first_part_size,
    part_size,
    saved_anyway,
    verify_saved,
)
from torchbucket.checkpoint._staging import (
    drop,
    promote,
    register_staging,
    renamed,
    stages_multipart,
    staging_key,
    staging_prefix,
)
from torchbucket.checkpoint._upload import (
    CONTENT_TYPE,
    MultipartSession,
    UploadSession,
    list_stale_candidates,
    open_session,
)
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.errors import (
    DeadlineExceededError,
    RetryableError,
    StorageError,
)
from torchbucket.storage.base import (
    MULTIPART_MAX_PARTS,
    ObjectInfo,
    ObjectStore,
)
from torchbucket.storage.crc32c import Crc32c, extend

__all__ = ["CheckpointWriter"]

logger = logging.getLogger(__name__)


class CheckpointWriter(io.BufferedIOBase):
    """A write-only, non-seekable binary file that uploads as it is written.

    Made by :meth:`BucketCheckpoint.writer`; use it as a context manager.

    Attributes:
        uri: The object being written.
        info: The finished object's metadata, after a successful close.
    """

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        config: CheckpointConfig,
        *,
        size_hint: int | None = None,
        content_type: str | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._content_type = content_type or CONTENT_TYPE
        self._key = key
        self._config = config
        self.uri = store.uri(key)
        self.info: ObjectInfo | None = None
        #: Where a multipart save is assembled first, on a store that does not
        #: check what it assembles (see _staging); ``None``: at ``key`` itself.
        self._staging: str | None = (
            staging_key(key)
            if config.upload_method == "multipart" and stages_multipart(store)
            else None
        )
        self._staging_held = False
        self._session: UploadSession = open_session(
            store, self._staging or key, config.upload_method, self._content_type
        )
        self._slots = threading.Semaphore(config.parts_in_flight)
        self._pool = BufferPool()
        self._base_part_size = first_part_size(config, size_hint)
        self._part: PartBuilder | None = None  # the part being filled
        self._parts = 0
        self._written = 0
        self._crc = Crc32c()
        #: Storages whose bytes parts may be views of (_lent), held until the end.
        self._lent: LentMemory | None = None
        #: A failure found by the writer itself, raised by ``close``.
        self._error: StorageError | None = None
        self._state: Literal["open", "committing", "committed", "aborted"] = "open"
        self._loop = runtime.get_loop()

    # -- file object ---------------------------------------------------------

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        """Bytes written so far."""
        self._check_open()
        return self._written

    def flush(self) -> None:
        """Nothing to do: a part uploads when it is full, the rest on close."""
        if self.closed:
            raise ValueError(f"I/O operation on a closed checkpoint writer ({self.uri})")

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        """Add ``data`` to parts, handing over each one that fills.

        Copied into the part's buffer, or, where ``data`` lies in a storage
        the save holds (see _lent, _gather), taken as a view of it.

        Blocks while ``parts_in_flight`` parts are uploading. Once a part
        has failed, or the checkpoint has outgrown the store's part limit,
        writes are dropped and ``close`` raises the failure: raising here would
        not reach the caller of ``torch.save``, whose zip writer replaces any
        error from ``write`` with its own ``RuntimeError`` ("unexpected pos").

        Raises:
            ValueError: The writer is closed.
        """
        self._check_open()
        view = memoryview(data).cast("B")
        total = len(view)
        if self._session.error is not None or self._error is not None:
            self._written += total
            return total
        lend = self._lent is not None and total >= LEND_MIN and self._lent.holds(view)
        offset = 0
        while offset < total and self._error is None:
            if self._part is None:
                self._part = PartBuilder(self._pool, self._part_size(self._parts + 1))
            part = self._part
            count = min(part.room, total - offset)
            if lend:
                part.lend(view[offset : offset + count])
            else:
                part.copy(view[offset : offset + count])
            offset += count
            if not part.room:
                self._hand_over()
        self._written += total
        return total

    def close(self) -> None:
        """Commit: upload what remains and make the object visible.

        Raises:
            StorageError: The upload failed; it was aborted and nothing became
                visible.
            IntegrityError: The finished object's CRC32C differs from what was
                written. The checkpoint was not replaced where the upload was
                staged (multipart on GCS); otherwise that object was deleted.
                Raised after the writer's own clean-up.
        """
        if self._state != "open":
            super().close()
            return
        self._state = "committing"
        # Listed while the last parts upload and the upload completes, rather
        # than after: a save costs no extra round trip for it.
        listing = (
            runtime.submit(list_stale_candidates(self._store, self._stale_prefix))
            if self._config.stale_upload_age is not None
            and isinstance(self._session, MultipartSession)
            else None
        )
        finished = False
        try:
            try:
                info = self._finish()
            except StorageError as exc:
                if self._staging is None:
                    raise
                error = renamed(exc, self._store.uri(self._staging), self.uri)
                if error is exc:
                    raise
                raise error from exc
            finished = True
            self.info = self._commit(info)
        finally:
            if finished:
                self._state = "committed"
            else:
                self._state = "aborted"
                if listing is not None:
                    listing.cancel()
                self._abort_after_failure()
                if self._staging_held:
                    # A completion without an answer may have made the staged object.
                    runtime.run(drop(self._store, self._upload_key))
            self._release_buffers()
            super().close()
        if listing is not None and self._config.stale_upload_age is not None:
            own = self._session.upload_id if isinstance(self._session, MultipartSession) else None
            abort_stale_after_save(
                self._store,
                self.uri,
                self._stale_prefix,
                listing,
                self._config.stale_upload_age,
                exact=self._staging is None,
                keep=own,
            )

    def abort(self) -> None:
        """Discard everything written; nothing becomes visible.

        Raises:
            StorageError: The store could not abort the upload (an incomplete
                upload may remain; ``torchbucket cleanup`` removes it).
        """
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            runtime.run(self._session.abort())
        finally:
            self._release_buffers()
            super().close()

    def __enter__(self) -> CheckpointWriter:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        if self._state == "open":
            self._state = "aborted"
            self._abort_after_failure()
            self._release_buffers()
            super().close()

    def __del__(self) -> None:
        if getattr(self, "_state", None) != "open":
            return
        self._state = "aborted"
        warnings.warn(
            f"checkpoint writer for {self.uri} was never closed; its upload is aborted",
            ResourceWarning,
            stacklevel=2,
        )
        # Not waited for: this may run anywhere, the loop thread included.
        runtime.submit(self._session.abort())

    # -- internals -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(f"I/O operation on a closed checkpoint writer ({self.uri})")

    def _raise_part_error(self) -> None:
        error = self._error or self._session.error
        if error is not None:
            raise error

    def _part_size(self, number: int) -> int:
        return part_size(self._base_part_size, number)

    def lend(self, memory: LentMemory) -> None:
        """Let parts be views of ``memory``'s storages, held until the save ends (see _lent)."""
        self._lent = memory or None

    def _hand_over(self) -> None:
        part = self._part
        assert part is not None
        self._part = None
        self._send(part.pieces(), part.buffers)

    def _send(self, pieces: list[memoryview], buffers: list[bytearray]) -> None:
        """Start the next part, ``pieces`` (of ``buffers``, pool buffers, or of lent storages)."""
        number = self._parts + 1
        if number > MULTIPART_MAX_PARTS and isinstance(self._session, MultipartSession):
            # Recorded, not raised: see write(). close() raises it.
            self._error = StorageError(
                f"the checkpoint needs more than the store's limit of {MULTIPART_MAX_PARTS} "
                f"parts (parts began at {self._base_part_size} bytes and grew to "
                f"{self._part_size(number - 1)}); raise CheckpointConfig.part_size "
                "or pass size_hint (the expected size in bytes) to BucketCheckpoint.writer()",
                operation="checkpoint save",
                uri=self.uri,
            )
            for buffer in buffers:
                self._pool.give(buffer)
            return
        # Checksummed once: the part declares this CRC32C (the store does not
        # compute it again) and the whole object's is combined from the parts'.
        crc = size = 0
        for piece in pieces:
            crc, size = extend(crc, piece), size + len(piece)
        self._crc.append(crc, size)
        self._slots.acquire()
        self._parts = number
        release = functools.partial(self._release_part, buffers)
        data = pieces[0] if len(pieces) == 1 else pieces
        self._loop.call_soon_threadsafe(self._session.start_part, number, data, release, crc)

    def _release_part(self, buffers: list[bytearray]) -> None:
        for buffer in buffers:
            self._pool.give(buffer)
        self._slots.release()

    def _release_buffers(self) -> None:
        self._lent = None  # every part is done: no view of a storage is read any more
        if self._part is not None:
            for buffer in self._part.buffers:
                self._pool.give(buffer)
        self._part = None
        self._pool.clear()

    def _finish(self) -> ObjectInfo:
        self._raise_part_error()
        # Counted here, not asked of the session: parts start on the loop thread.
        if self._parts == 0:
            pieces = self._part.pieces() if self._part is not None else []
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._crc.update(data)
            return runtime.run(self._store.put(self._key, data, content_type=self._content_type))
        if self._part is not None and self._part.filled:
            self._hand_over()
            self._raise_part_error()  # the last part may be one too many
        if self._staging is not None and not self._staging_held:
            # From before the completion: it may take effect unanswered.
            register_staging(self._store, self._staging)
            self._staging_held = True
        try:
            return runtime.run(self._session.finish())
        except (RetryableError, DeadlineExceededError) as exc:
            # No definite answer: the completion may have happened all the same.
            info = self._saved_anyway()
            if info is None:
                raise
            logger.info(
                "%s: completing the upload failed (%s), but the object holds what was "
                "written: saved",
                self.uri,
                type(exc).__name__,
            )
            return info

    def _saved_anyway(self) -> ObjectInfo | None:
        """The object, if it holds exactly what was written (size and CRC32C)."""
        return saved_anyway(self._store, self._upload_key, self._written, self._crc.b64())

    @property
    def _upload_key(self) -> str:
        """Where the upload goes: the staging name, or the checkpoint's own."""
        return self._staging or self._key

    @property
    def _stale_prefix(self) -> str:
        """What the uploads that earlier saves of this checkpoint left start with."""
        return self._key if self._staging is None else staging_prefix(self._key)

    def _commit(self, info: ObjectInfo) -> ObjectInfo:
        """Check the finished upload and, where it was staged, put it in place."""
        if self._staging is not None and info.name == self._staging:
            expected = self._crc.b64() if self._config.verify_crc32c else None
            try:
                return runtime.run(
                    promote(self._store, info, self._key, size=self._written, crc32c=expected)
                )
            finally:
                self._staging_held = False  # dropped by promote, or left to exit cleanup
        if self._config.verify_crc32c:
            return self._verify(info)
        return info

    def _verify(self, info: ObjectInfo) -> ObjectInfo:
        return verify_saved(self._store, self._key, info, self._written, self._crc.b64())

    def _abort_after_failure(self) -> None:
        # Called while another exception propagates: that one is what the caller
        # sees; a failure to abort on top of it is logged with what to do.
        try:
            runtime.run(self._session.abort())
        except StorageError:
            logger.warning(
                "could not abort the upload to %s after a failed save; "
                "`torchbucket cleanup` removes incomplete uploads",
                self.uri,
                exc_info=True,
            )
