"""Lightning ``CheckpointIO`` plugins that save to and load from a bucket."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from torchbucket._checks import check_int
from torchbucket._uri import uri_text
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint.checks import check_checkpoint_arguments
from torchbucket.lightning._filesystem import set_active_checkpoint

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["AsyncBucketCheckpointIO", "BucketCheckpointIO"]

logger = logging.getLogger(__name__)


def _uri(path: str | os.PathLike[str]) -> str:
    text = uri_text(path)
    if "://" in text:
        return text
    # A plain path (ModelCheckpoint with a local dirpath): the local store.
    return "file://" + os.path.abspath(text)


class BucketCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """Saves Lightning checkpoints to ``gs://``, ``memory://`` or ``file://``.

    Each save streams ``torch.save`` into a parallel multipart upload; a
    checkpoint appears only when complete. Loads fetch byte ranges in parallel.

    Example::

        trainer = Trainer(
            plugins=[BucketCheckpointIO()],
            callbacks=[ModelCheckpoint(dirpath="gs://bucket/run/")],
        )

    Args:
        checkpoint: A :class:`CheckpointConfig`: part sizes and parallelism.
            Default ``CheckpointConfig()``.
        gcs: Endpoint and credentials for ``gs://``. Default ``GCSConfig()``.
        bucket_checkpoint: A :class:`BucketCheckpoint` to use instead of making
            one from ``checkpoint`` and ``gcs``.

    Raises:
        ConfigError: An argument is not of its type (a project name where
            ``checkpoint`` belongs: gcs-torch-dataflux's
            ``DatafluxLightningCheckpoint(project_name)`` is
            :class:`torchbucket.dataflux.lightning.DatafluxLightningCheckpoint`),
            or ``bucket_checkpoint`` came with ``checkpoint`` or ``gcs``.
    """

    def __init__(
        self,
        *,
        checkpoint: CheckpointConfig | None = None,
        gcs: GCSConfig | None = None,
        bucket_checkpoint: BucketCheckpoint | None = None,
    ) -> None:
        owner = type(self).__name__
        hint = ""
        if isinstance(checkpoint, str):
            hint = (
                "for gcs-torch-dataflux's DatafluxLightningCheckpoint(project_name) use "
                "torchbucket.dataflux.lightning.DatafluxLightningCheckpoint"
            )
        check_checkpoint_arguments(owner, checkpoint, gcs, bucket_checkpoint, hint=hint)
        super().__init__()
        self.checkpoint = bucket_checkpoint or BucketCheckpoint(config=checkpoint, gcs=gcs)
        set_active_checkpoint(self.checkpoint)

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        """``torch.save`` the checkpoint to ``path``.

        Raises:
            TypeError: ``storage_options`` were given (there are none).
            StorageError: The upload failed; nothing was written.
        """
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options; "
                "configure it with CheckpointConfig"
            )
        self.checkpoint.save(checkpoint, _uri(path))

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """``torch.load`` the checkpoint at ``path`` (:meth:`BucketCheckpoint.load`).

        The download goes into an in-memory file that torch maps, so the
        tensors are the downloaded pages, not copies; ``map_location`` CPU
        costs nothing more, a CUDA device one host-to-device copy per tensor.

        Raises:
            NotFoundError: No checkpoint there (a ``FileNotFoundError``).
        """
        loaded: dict[str, Any] = self.checkpoint.load(
            _uri(path), map_location=map_location, weights_only=weights_only
        )
        return loaded

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete the checkpoint at ``path``; a missing one is not an error."""
        self.checkpoint.delete(_uri(path), missing_ok=True)

    def teardown(self) -> None:
        """Nothing to release: stores are shared and close at process exit."""


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


class AsyncBucketCheckpointIO(BucketCheckpointIO):
    """Like :class:`BucketCheckpointIO`, but saves in a background thread.

    ``save_checkpoint`` copies the checkpoint's tensors (training goes on and
    changes them) and returns; one thread uploads the copies in order, so a
    removal of an older checkpoint never overtakes its save. At most
    ``max_pending`` saves wait or run at once; another call blocks until one
    finishes, so copies do not pile up when uploads are slower than training.

    A failed save is never silent: the next ``save_checkpoint``,
    ``remove_checkpoint``, ``load_checkpoint``, :meth:`wait` or ``teardown``
    raises it. ``teardown`` (called by the ``Trainer`` at the end of ``fit``)
    waits for every pending save.

    Args:
        checkpoint: As for :class:`BucketCheckpointIO`.
        gcs: As for :class:`BucketCheckpointIO`.
        bucket_checkpoint: As for :class:`BucketCheckpointIO`.
        max_pending: Saves in the queue at once. Default 1.
    """

    def __init__(
        self,
        *,
        checkpoint: CheckpointConfig | None = None,
        gcs: GCSConfig | None = None,
        bucket_checkpoint: BucketCheckpoint | None = None,
        max_pending: int = 1,
    ) -> None:
        check_int(max_pending, owner=type(self).__name__, parameter="max_pending", minimum=1)
        super().__init__(checkpoint=checkpoint, gcs=gcs, bucket_checkpoint=bucket_checkpoint)
        self.max_pending = max_pending
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[None]] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def _submit(self, fn: Any, *args: Any) -> None:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="torchbucket-checkpoint"
                )
            future = self._executor.submit(fn, *args)
            self._pending.append(future)
        # Outside the lock: a future that is already done runs the callback here.
        future.add_done_callback(self._log_failure)

    @staticmethod
    def _log_failure(future: concurrent.futures.Future[None]) -> None:
        # Logged as it happens; raised to the caller by _reap on its next call.
        if not future.cancelled() and future.exception() is not None:
            logger.error("background checkpoint operation failed: %s", future.exception())

    def _reap(self) -> None:
        """Forget finished operations, keeping the first failure. Hold the lock."""
        for future in self._pending:
            if future.done() and self._error is None and future.exception() is not None:
                self._error = future.exception()
        self._pending = [f for f in self._pending if not f.done()]

    def _raise_error(self) -> None:
        with self._lock:
            self._reap()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _wait_below(self, limit: int) -> None:
        while True:
            with self._lock:
                self._reap()
                if len(self._pending) <= limit:
                    return
                oldest = self._pending[0]
            concurrent.futures.wait([oldest])

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        """Copy the checkpoint's tensors and save it in the background.

        Raises:
            StorageError: An earlier background save failed.
        """
        self._raise_error()
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options; "
                "configure it with CheckpointConfig"
            )
        self._wait_below(self.max_pending - 1)
        snapshot = apply_to_collection(checkpoint, torch.Tensor, _snapshot)
        self._submit(BucketCheckpointIO.save_checkpoint, self, snapshot, path)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete ``path`` after the saves queued before this call."""
        self._raise_error()
        self._submit(BucketCheckpointIO.remove_checkpoint, self, path)

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Wait for pending saves, then load ``path``."""
        self.wait()
        return super().load_checkpoint(path, map_location, weights_only)

    def wait(self) -> None:
        """Block until every queued save and removal is done.

        Raises:
            StorageError: One of them failed.
        """
        self._wait_below(0)
        self._raise_error()

    def teardown(self) -> None:
        """Wait for pending saves and stop the thread; raise a failed save."""
        try:
            self._wait_below(0)
        finally:
            with self._lock:
                executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)
        self._raise_error()
