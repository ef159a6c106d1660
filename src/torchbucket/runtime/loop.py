"""One background event loop per process, and a synchronous facade over it.

Datasets, checkpoint streams and the CLI are synchronous; the stores are async.
``run(coro)`` hands a coroutine to the process's loop thread and blocks until it
is done, re-raising its exception with the original traceback.

Fork-safe: a DataLoader worker forked after the parent used a store finds no loop
thread (threads do not survive ``fork``); the first ``run`` in the child starts a
fresh loop, and stores notice the new loop and open fresh sessions. Spawn-safe:
stores pickle as their configuration and nothing here is pickled.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "PARENT_CHECK_S",
    "at_shutdown",
    "get_loop",
    "in_loop_thread",
    "main_process_gone",
    "run",
    "shutdown",
    "submit",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None
# (priority, callback): lower priorities run first at shutdown.
_shutdown_hooks: list[tuple[int, Callable[[], Awaitable[None]]]] = []
_SHUTDOWN_TIMEOUT = 30.0

#: Seconds between the checks, in a blocking wait of a DataLoader worker, that
#: the worker's main process is still there.
PARENT_CHECK_S = 1.0
# The process that started this one: a forked worker's is set after the
# fork, a spawned worker's when it imports torchbucket (unpickling its dataset).
_parent_pid = os.getppid()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # type: ignore[import-not-found]

        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.new_event_loop()


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def get_loop() -> asyncio.AbstractEventLoop:
    """The process's background loop, started on first use (again after fork)."""
    global _loop, _thread, _pid
    pid = os.getpid()
    if _loop is not None and _pid == pid and _thread is not None and _thread.is_alive():
        return _loop
    with _lock:
        if _loop is None or _pid != pid or _thread is None or not _thread.is_alive():
            loop = _new_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=_serve, args=(loop, ready), name="torchbucket-loop", daemon=True
            )
            thread.start()
            ready.wait()
            _loop, _thread, _pid = loop, thread, pid
        return _loop


def in_loop_thread() -> bool:
    """Whether the caller runs on the background loop's own thread."""
    return _thread is not None and threading.current_thread() is _thread and _pid == os.getpid()


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the background loop and return a future for it."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the background loop and wait for its result.

    Args:
        coro: The coroutine.
        timeout: Seconds to wait, or ``None``. On timeout the coroutine is
            cancelled and ``TimeoutError`` raised.

    Raises:
        RuntimeError: Called from the loop thread itself (it would deadlock).
    """
    if in_loop_thread():
        coro.close()
        raise RuntimeError("torchbucket.runtime.run() called from its own event loop thread")
    future = submit(coro)
    try:
        if timeout is None:
            return _result_unless_orphaned(future)
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        if future.done():
            # The coroutine itself raised a TimeoutError (DeadlineExceededError is one).
            raise
        future.cancel()
        raise TimeoutError(f"operation did not finish within {timeout} s") from None
    except KeyboardInterrupt:
        future.cancel()
        raise


def main_process_gone() -> str | None:
    """Why a DataLoader worker should stop waiting: its main process has exited.

    torch's worker loop looks for a dead main process only between tasks, so
    a worker whose task waits on a stalled bucket (retried up to the retry
    deadline, minutes) would go on reading for nobody. ``None`` outside a
    worker, and while the main process lives.
    """
    data = sys.modules.get("torch.utils.data")
    if data is None or data.get_worker_info() is None or os.getppid() == _parent_pid:
        return None
    return (
        f"the DataLoader's main process (pid {_parent_pid}) has exited: "
        f"worker {os.getpid()} stops waiting for its reads"
    )


def _result_unless_orphaned(future: concurrent.futures.Future[T]) -> T:
    """``future``'s result; in a worker whose main process exits, cancel it and raise."""
    while True:
        try:
            return future.result(PARENT_CHECK_S)
        except concurrent.futures.TimeoutError:
            if future.done():
                raise  # the coroutine's own TimeoutError (DeadlineExceededError is one)
            gone = main_process_gone()
            if gone is not None:
                future.cancel()
                raise RuntimeError(gone) from None


def at_shutdown(callback: Callable[[], Awaitable[None]], *, priority: int = 100) -> None:
    """Run ``callback`` on the loop when the process exits normally.

    Lower priorities run first: cleanup that needs the network (deleting
    composed objects) registers below the stores' own ``close`` (priority 100).
    """
    _shutdown_hooks.append((priority, callback))


def _forget(callback: Callable[[], Awaitable[None]]) -> None:
    _shutdown_hooks[:] = [(p, cb) for p, cb in _shutdown_hooks if cb is not callback]


async def _run_hooks() -> None:
    for _, callback in sorted(_shutdown_hooks, key=lambda item: item[0]):
        try:
            await callback()
        except Exception:  # a failing hook must not stop the others
            logger.warning("torchbucket shutdown hook %r failed", callback, exc_info=True)


async def _cancel_pending() -> None:
    # Work still in flight at exit (a prefetch window nobody will read, an
    # iterator dropped mid-epoch) is cancelled and awaited, so that stopping the
    # loop does not leave tasks for the interpreter to report as destroyed.
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=1.0)


def shutdown() -> None:
    """Run the shutdown hooks and stop the loop. Called at interpreter exit."""
    global _loop, _thread, _pid
    if _loop is None or _pid != os.getpid() or _thread is None or not _thread.is_alive():
        return
    loop, thread = _loop, _thread
    if _shutdown_hooks:
        try:
            asyncio.run_coroutine_threadsafe(_run_hooks(), loop).result(_SHUTDOWN_TIMEOUT)
        except Exception:
            logger.warning("torchbucket shutdown hooks did not finish", exc_info=True)
    try:
        asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(_SHUTDOWN_TIMEOUT)
    except Exception:
        logger.debug("torchbucket: pending tasks did not end at exit", exc_info=True)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    _loop = _thread = _pid = None


def _after_fork_in_child() -> None:
    # The loop thread did not survive the fork; its loop object must not be used.
    global _loop, _thread, _pid, _lock, _parent_pid
    _loop = _thread = _pid = None
    _lock = threading.Lock()
    _parent_pid = os.getppid()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)
