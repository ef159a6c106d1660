"""Telling bytes that are no torch checkpoint from one that torch refuses to load.

``torch.load`` of random bytes, text or a truncated object fails with whatever
its parser met first: an ``EOFError`` with no message, ``KeyError: 101``, an
``UnpicklingError`` or a ``RuntimeError`` from the zip reader, none of them
naming the object. After a failed load the bytes are looked at once more:
torch writes a zip archive with a ``data.pkl`` record (or, before torch 1.6, a
pickle that starts with its magic number); bytes that are neither, a zip
without its directory (truncated) and a legacy pickle cut short are not a
readable checkpoint, and that is raised as a
:class:`~torchbucket.errors.CheckpointError` naming the URI, chained from
torch's error. Any other failure (a global ``weights_only`` refuses, a
``map_location`` the host lacks) is a real checkpoint's, and torch's error
stands.
"""

from __future__ import annotations

import pickle
import zipfile
from typing import IO

from torchbucket.errors import CheckpointError, TorchBucketError

__all__ = ["raise_if_unreadable"]

_ZIP_MAGIC = b"PK\x03\x04"
# torch's legacy format starts with its magic number, pickled (protocol 2).
_LEGACY_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


def raise_if_unreadable(uri: str, f: IO[bytes], exc: Exception, *, size: int) -> None:
    """Raise :class:`CheckpointError` from ``exc`` if ``f`` holds no readable checkpoint.

    Args:
        uri: The object, for the message.
        f: The bytes ``torch.load`` failed on (seekable; its position moves).
        exc: What ``torch.load`` raised.
        size: How many bytes of ``f`` are the object's.

    Raises:
        CheckpointError: The bytes are empty, truncated or not a torch
            checkpoint. Returns (leaving ``exc`` to its caller) otherwise.
    """
    if isinstance(exc, TorchBucketError):
        return  # the download's own error (a refill that failed), already named
    reason = _why_unreadable(f, exc) if size else "the object is empty"
    if reason is None:
        return
    raise CheckpointError(
        f"not a readable torch checkpoint: {reason} (torch.load raised {type(exc).__name__})",
        operation="checkpoint load",
        uri=uri,
    ) from exc


def _why_unreadable(f: IO[bytes], exc: Exception) -> str | None:
    f.seek(0)
    head = f.read(len(_LEGACY_MAGIC))
    if head.startswith(_ZIP_MAGIC):
        try:
            f.seek(0)
            with zipfile.ZipFile(f) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, EOFError, ValueError, OSError):
            return "a zip archive without its directory: truncated or corrupt"
        if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "a zip archive that holds no torch checkpoint (no data.pkl)"
        return None
    if head == _LEGACY_MAGIC:
        # torch's pre-1.6 format has no directory to check: its parsers say a
        # cut-short stream with EOFError, or in words ("pickle data was
        # truncated", "unexpected EOF, expected N more bytes").
        text = str(exc)
        truncated = isinstance(exc, EOFError) or "truncated" in text or "EOF" in text
        return "a legacy torch checkpoint, truncated" if truncated else None
    return "neither torch's zip format nor its legacy format: corrupt or not a checkpoint"
