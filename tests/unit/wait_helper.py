"""Waiting, in tests, for something another thread or process does in its own time.

``wait_for(predicate)`` polls until ``predicate()`` is true or ``timeout``
seconds have passed, and says which. A test asserts on the answer: the state
it waits for is required, only not at any particular instant (a prefetch
window deleting the composites it has read, a worker that was killed going
away). It is never a timing bound: the default allows 30 s on a loaded
machine.

A module of its own for the reason ``memory_helper`` is (see there);
integration tests put ``tests/unit`` on ``sys.path`` to import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_for"]


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
