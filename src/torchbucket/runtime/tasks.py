"""Running many coroutines as one: all of them finish, or none is left behind.

``asyncio.gather`` raises the first failure and leaves the other awaitables
running: a read still filling a buffer the caller is about to free or reuse, an
upload still sending parts of an upload being aborted. :func:`gather_or_cancel`
cancels the rest and waits for them to stop before it raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ["gather_or_cancel"]

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
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
