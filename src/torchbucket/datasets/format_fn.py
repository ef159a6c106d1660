"""Calling a user's ``data_format_fn``: an error it raises says which sample it failed on.

Every dataset of the library (objects, map-style and iterable; packed shards,
map-style and streamed) calls its ``data_format_fn`` through
:func:`call_format_fn`. The error keeps its type; on Python 3.11+ it gains a
note naming the sample, which shows in the traceback, and so in the message a
DataLoader worker's error is re-raised with in the main process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["call_format_fn"]


def call_format_fn(fn: Callable[[Any], Any], data: Any, where: str) -> Any:
    """``fn(data)``; an exception it raises gains the note "data_format_fn failed on ``where``"."""
    try:
        return fn(data)
    except Exception as exc:
        add_note = getattr(exc, "add_note", None)  # Python 3.11+
        if add_note is not None:
            add_note(f"torchbucket: data_format_fn failed on {where}")
        raise
