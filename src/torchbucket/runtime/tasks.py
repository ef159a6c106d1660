"""Running many coroutines as one: all of them finish, or none is left behind.

``asyncio.gather`` raises the first failure and leaves the other awaitables
running: a read still filling a buffer the caller is about to free or reuse, an
upload still sending parts of an upload being aborted. :func:`gather_or_cancel`
cancels the rest and waits for them to stop before it raises;
:func:`cancel_and_wait` is that last step, for tasks started one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

__all__ = ["cancel_and_wait", "gather_or_cancel"]

T = TypeVar("T")


async def gather_or_cancel(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Await every one of ``awaitables`` as tasks; on a failure, stop the others.

    The first exception (or the caller's cancellation) cancels every task not
    yet done and waits until each has stopped, then propagates; the others'
    exceptions are consequences of that and are dropped.

    Args:
        awaitables: Coroutines, tasks or futures of the running loop.

    Returns:
        Their results, in the order given.
    """
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        await cancel_and_wait(tasks)
        raise


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel every one of ``tasks`` not yet done and wait until each has stopped.

    Their results and exceptions are dropped: the caller is giving up on them
    (a failure elsewhere, an abort), and waits only so that none still uses
    what the caller is about to free or reuse.
    """
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
