"""Composites in flight in this process, and their deletion at exit.

Every composite is registered before its compose request is sent (a request
may take effect even when its answer is lost) and forgotten once deleted. What
is still registered when the process ends is deleted:

- at interpreter exit, by a ``runtime.at_shutdown`` hook (priority 50, before
  the stores close at 100) and an ``atexit`` handler;
- in DataLoader workers, which end with ``os._exit`` and skip ``atexit``, by a
  ``multiprocessing.util.Finalize`` registered in the worker itself;
- on SIGTERM, by a handler installed once per process from its main thread,
  which then hands the signal to the handler it replaced; in a DataLoader
  worker it then exits quietly (status 0), as PyTorch's own handler there
  does when the DataLoader ends its workers.

A process killed outright (SIGKILL, OOM) leaves its composites behind;
:func:`torchbucket.compose.cleanup_composites` (``torchbucket cleanup``) removes
them. A forked child starts with an empty registry: its parent's composites are
the parent's to delete.

Not user API: the datasets and the checkpoint writer (its staged objects)
register here.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from torchbucket import runtime
from torchbucket.compose._recent import RecentTimes
from torchbucket.errors import NotFoundError, StorageError
from torchbucket.runtime.tasks import cancel_and_wait
from torchbucket.storage.base import ObjectStore

__all__ = [
    "cleanup_registered",
    "delete_composite",
    "delete_in_background",
    "drain_also",
    "drain_deletes",
    "in_flight",
    "install_sigterm_handler",
    "register",
    "unregister",
]

logger = logging.getLogger(__name__)

_EXIT_TIMEOUT_S = 20.0

_lock = threading.Lock()
_in_flight: dict[str, tuple[ObjectStore, str]] = {}
# Deletes running in the background on the runtime loop (loop thread only).
_deleting: set[asyncio.Task[StorageError | None]] = set()
# Work that may still create a composite and then delete it (a compose path
# read around), which drain_deletes also waits for (loop thread only), and
# what a drain may run to end such work sooner.
_pending: set[asyncio.Future[Any]] = set()
_settles: dict[asyncio.Future[Any], Callable[[], Awaitable[None]]] = {}
_finalizer_pid: int | None = None
_exit_hooks_installed = False
_sigterm_pid: int | None = None
_previous_sigterm: Any = None
_sigterm_exits_quietly = False


def in_flight() -> list[str]:
    """URIs of the composites this process has created and not yet deleted."""
    with _lock:
        return sorted(_in_flight)


def register(store: ObjectStore, name: str) -> None:
    """Record a composite about to be created, and make sure exit cleanup runs."""
    _ensure_exit_hooks()
    with _lock:
        _in_flight[store.uri(name)] = (store, name)


def unregister(store: ObjectStore, name: str) -> None:
    """Forget a composite that is gone (deleted, or never created)."""
    with _lock:
        _in_flight.pop(store.uri(name), None)


async def delete_composite(
    store: ObjectStore,
    name: str,
    generation: int | None = None,
    *,
    resend_after: float = 0.0,
    resend_floor: float = 0.0,
) -> StorageError | None:
    """Delete a composite and forget it; keep it registered if that failed.

    Args:
        store: Where the composite is.
        name: Its name.
        generation: Its generation, when known: a delete pinned to it is
            retried on transient failures (one without is not, by the store).
        resend_after: A pinned delete still unanswered after this many times
            the median of the process's recent deletes on ``store`` (at least
            ``resend_floor`` seconds) is sent again, and the first answer
            counts; ``0`` never sends one twice.
        resend_floor: See ``resend_after``.

    Returns:
        ``None`` when the composite is gone (deleted now, or already missing),
        else the error that kept it.
    """
    try:
        if generation is None or resend_after <= 0:
            await store.delete(name, generation=generation)
        else:
            await _delete_resent(store, name, generation, resend_after, resend_floor)
    except NotFoundError:
        pass
    except StorageError as exc:
        logger.warning(
            "could not delete composite %s (%s); it stays registered for deletion at exit, "
            "and `torchbucket cleanup` removes it otherwise",
            store.uri(name),
            exc,
        )
        return exc
    unregister(store, name)
    return None


# Recent composite delete times per store URI, for delete_composite's resend_after.
_recent_deletes = RecentTimes()


async def _delete_resent(
    store: ObjectStore, name: str, generation: int, factor: float, floor: float
) -> None:
    """A pinned delete, sent again if it straggles; raises as ``store.delete``.

    Why: a dataset's epoch ends by waiting for its composites' deletes, so one
    delete stalled for seconds held a sub-second epoch for seconds (measured:
    2 runs in 8 of a 6,000 x 10 KiB epoch under ``same-region-tail``, drains
    of 1.3 and 1.6 s). Two deletes of one generation are safe in any order:
    the loser finds it gone (404, taken as deleted). Deletes are free
    operations on GCS (https://cloud.google.com/storage/pricing#operations-by-class).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    key = store.uri()
    after = _recent_deletes.straggling_after(key, factor, floor)
    first = asyncio.ensure_future(store.delete(name, generation=generation))
    sent = {first}
    try:
        done, _ = await asyncio.wait(sent, timeout=after)
        if not done:
            logger.debug(
                "delete of %s unanswered after %.3f s: sending it again",
                store.uri(name),
                loop.time() - started,
            )
            sent.add(asyncio.ensure_future(store.delete(name, generation=generation)))
        error: BaseException | None = None
        while sent:
            done, _ = await asyncio.wait(sent, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                sent.discard(task)
                exc = task.exception()
                if exc is None or isinstance(exc, NotFoundError):
                    _recent_deletes.add(key, loop.time() - started)
                    return
                error = error or exc
        assert error is not None
        raise error
    finally:
        await cancel_and_wait(sent)


def delete_in_background(
    store: ObjectStore,
    name: str,
    generation: int | None = None,
    on_error: Callable[[StorageError], None] | None = None,
    *,
    resend_after: float = 0.0,
    resend_floor: float = 0.0,
) -> None:
    """Delete a composite in a task of the running loop, off the caller's path.

    The composite stays registered until it is gone, so the exit, worker and
    SIGTERM cleanups cover a delete still pending; :func:`drain_deletes` waits
    for those pending.

    Args:
        store: Where the composite is.
        name: Its name.
        generation: Its generation, when known (see :func:`delete_composite`).
        on_error: Called with the error when the delete failed.
        resend_after: See :func:`delete_composite`.
        resend_floor: See :func:`delete_composite`.
    """
    task = asyncio.get_running_loop().create_task(
        delete_composite(
            store, name, generation, resend_after=resend_after, resend_floor=resend_floor
        )
    )
    _deleting.add(task)

    def done(task: asyncio.Task[StorageError | None]) -> None:
        _deleting.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # not a StorageError: a bug, logged, the name stays registered
            logger.error("deleting composite %s failed", store.uri(name), exc_info=error)
            return
        result = task.result()
        if result is not None and on_error is not None:
            on_error(result)

    task.add_done_callback(done)


def drain_also(
    future: asyncio.Future[Any], settle: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Make :func:`drain_deletes` wait for ``future`` too, until it is done.

    For work left running that may still create a composite and start its
    delete (a compose path whose group was read around it): an epoch that
    ends by draining must not end before that composite is gone.

    Args:
        future: The work.
        settle: Run once by the first drain that finds ``future`` still
            running, beside it: it may end the work sooner (by cancelling it
            once that is safe), and is waited for too.
    """
    _pending.add(future)
    if settle is not None:
        _settles[future] = settle
    future.add_done_callback(_forget_pending)


def _forget_pending(future: asyncio.Future[Any]) -> None:
    _pending.discard(future)
    _settles.pop(future, None)


async def drain_deletes() -> None:
    """Wait for the composite deletes running in the background to finish.

    Also waits for the work handed to :func:`drain_also` (running its
    ``settle``), and then for the deletes it started. Must run on the
    runtime loop. Failures are not raised: a composite whose delete failed
    stays registered (see :func:`delete_composite`).
    """
    settling: set[asyncio.Future[None]] = set()
    began = time.monotonic()
    waited_for = len(_deleting) + len(_pending)
    while _deleting or _pending or settling:
        for future in list(_pending):
            settle = _settles.pop(future, None)
            if settle is not None:
                settling.add(asyncio.ensure_future(settle()))
        done, _ = await asyncio.wait(
            _deleting | _pending | settling, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done & settling:
            settling.discard(task)
            if not task.cancelled() and task.exception() is not None:
                logger.error("settling a compose path failed", exc_info=task.exception())
    logger.debug(
        "drain %.4f s: %d deletes and compose paths in flight at its start",
        time.monotonic() - began,
        waited_for,
    )


async def cleanup_registered() -> int:
    """Delete every composite still registered in this process.

    Returns:
        How many were deleted (or found already gone).
    """
    with _lock:
        pending = list(_in_flight.values())
    deleted = 0
    for store, name in pending:
        if await delete_composite(store, name) is None:
            deleted += 1
    return deleted


def _cleanup_sync() -> None:
    with _lock:
        if not _in_flight:
            return
    if runtime.in_loop_thread():
        return
    try:
        n = runtime.run(cleanup_registered(), timeout=_EXIT_TIMEOUT_S)
    except Exception:  # at exit: report, never raise into the interpreter's teardown
        logger.warning("deleting composites at exit failed", exc_info=True)
    else:
        logger.debug("deleted %d composites left in flight at exit", n)


async def _shutdown_hook() -> None:
    await cleanup_registered()


def _ensure_exit_hooks() -> None:
    global _finalizer_pid, _exit_hooks_installed
    pid = os.getpid()
    if _finalizer_pid == pid:
        return
    with _lock:
        if _finalizer_pid == pid:
            return
        if not _exit_hooks_installed:
            # Inherited by forked children, where they find an empty registry.
            runtime.at_shutdown(_shutdown_hook, priority=50)
            atexit.register(_cleanup_sync)
            _exit_hooks_installed = True
        # multiprocessing children (DataLoader workers) run their finalizers
        # before os._exit; the registry of finalizers is cleared in each child,
        # so each process registers its own.
        multiprocessing.util.Finalize(None, _cleanup_sync, exitpriority=100)
        _finalizer_pid = pid


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _cleanup_sync()
    if _sigterm_exits_quietly:
        # A DataLoader worker. PyTorch's C handler, which this one replaced
        # (Python cannot see or call it), ends a worker with status 0 when its
        # parent sent the signal: the DataLoader ends persistent workers that
        # way at exit, and a worker killed by the signal makes the parent print
        # "DataLoader worker (pid ...) is killed by signal: Terminated" while
        # it exits. Python's handlers are not told the sender, so every SIGTERM
        # ends a worker that way; a worker ended by anyone else mid-epoch is
        # still reported by its DataLoader ("exited unexpectedly").
        os._exit(0)
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_sigterm_handler(*, dataloader_worker: bool = False) -> bool:
    """Delete this process's composites on SIGTERM, then pass the signal on.

    Installed at most once per process, and only from the main thread (Python
    allows signal handlers nowhere else). The handler replaced is called
    afterwards; where it was the default, the signal is re-raised so the process
    still ends as it would have. Where Python reports a handler it did not
    install (``None``), nothing is installed, since it could not be chained.

    In a DataLoader worker Python sees the default (PyTorch's C-level handler
    is invisible to it, and one inherited over fork from the parent is what
    Python remembers, not what is in place), so there the handler is always
    installed, and after deleting the composites it ends the worker with
    status 0, as PyTorch's handler does when the DataLoader ends a worker.

    Args:
        dataloader_worker: Whether this process is a DataLoader worker.

    Returns:
        Whether the handler is in place.
    """
    global _sigterm_pid, _previous_sigterm, _sigterm_exits_quietly
    pid = os.getpid()
    if _sigterm_pid == pid:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if dataloader_worker:
        _sigterm_exits_quietly = True
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_pid = pid
        return True
    _sigterm_exits_quietly = False
    if current is _on_sigterm:  # inherited over fork: already chained
        _sigterm_pid = pid
        return True
    if current is None:
        return False
    _previous_sigterm = current
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_pid = pid
    return True


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _in_flight.clear()
    _deleting.clear()
    _pending.clear()
    _settles.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
