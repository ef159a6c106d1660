"""What both datasets share: applying ``data_format_fn``, the compose hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchbucket.compose import ComposeConfig, install_sigterm_handler
from torchbucket.datasets._catalog import Catalog

__all__ = ["DataFormatFn", "apply_format", "prepare_compose", "raise_item"]

DataFormatFn = Callable[[bytes], Any]


def apply_format(fn: DataFormatFn | None, data: bytes, catalog: Catalog, index: int) -> Any:
    """``fn(data)``; an error it raises keeps its type and gains a note naming the URI.

    The note shows in the traceback, and so in the message a DataLoader worker's
    error is re-raised with in the main process.
    """
    if fn is None:
        return data
    try:
        return fn(data)
    except Exception as exc:
        add_note = getattr(exc, "add_note", None)
        if add_note is not None:
            add_note(f"torchbucket: data_format_fn failed on {catalog.uri(index)}")
        raise


def raise_item(item: bytes | BaseException) -> bytes:
    """The bytes, or raise the error fetching them raised."""
    if isinstance(item, BaseException):
        raise item
    return item


def prepare_compose(compose: ComposeConfig) -> None:
    """Before fetching in a process: SIGTERM deletes its composites (main thread)."""
    if compose.enabled:
        install_sigterm_handler()
