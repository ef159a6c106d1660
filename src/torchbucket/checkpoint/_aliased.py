"""Loading a checkpoint into anonymous pages that the loaded tensors alias (issue 45).

``torch.load(path, mmap=True)`` maps a file and slices every tensor's storage
out of that one mapping (the ``overall_storage`` of torch's zip loader). The
mapped load (:mod:`._mapped`) hands torch such a file: a memfd. What that costs
beyond the download, measured on the 2-core benchmark VM: a memfd's pages are
shared memory, which the kernel allocates at 0.43-0.47 CPU s/GiB against
0.28 for anonymous ones; unmapping the download's own view of them (torch maps
the file again) 0.15 s/GiB; in all a load cost 1.27x the floor's CPU per GiB at
1 GiB and 1.46x at 4 GiB, the floor being the same download into anonymous
pages.

Here the download goes into those anonymous pages (:func:`._pages.allocate`,
the same ranges pinned to one generation, prefaulted by the waiting thread),
and torch's zip loader gets them as its ``overall_storage``: one
``UntypedStorage`` over the buffer (``torch.frombuffer``, which keeps the
buffer alive as long as any storage sliced from it), so every tensor is a
view of the downloaded bytes, exactly as with a mapped file, with no file, no
second mapping, and pages written in place without a copy (nothing else sees
them).

torch unpickles while another thread computes the CRC32C of every byte, and
the tensors are returned only once it matches (on a mismatch they are dropped
and the bytes read again: :func:`._reader.download`). The weights-only loader
reads bytes nobody has checked yet; it must be safe on any bytes anyway, since
a hostile writer stores a CRC32C that matches what it wrote. Measured on the
benchmark's 512 MiB state dict (790 tensors), in one process on the 2-core
VM: the CRC32C pass 0.09 s, torch's loader 0.04-0.07 s, both side by side
0.09 s; in the benchmark's loads from the emulator the two had taken 0.25 s of
0.66, one after the other.

torch's loader is ``torch.serialization._load``, which ``torch.load`` itself
calls: not public, so this path is taken only where it has the signature torch
2.1-2.13 give it, and only for what it replaces one to one: a zip checkpoint
(not TorchScript) loaded with ``weights_only=True`` (explicit, or torch's
default) and no argument but ``map_location``. Anything else, or a checkpoint
``weights_only`` refuses (torch's own message then), goes through
``torch.load`` (:mod:`._mapped`, or a copy out of the same bytes), with one
DEBUG line where the bytes were already downloaded.
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
from typing import IO, Any, cast

from torchbucket import runtime
from torchbucket.checkpoint._pages import allocate
from torchbucket.checkpoint._reader import MemoryFile, download
from torchbucket.checkpoint._unreadable import raise_if_unreadable
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.storage.base import ObjectStore

__all__ = ["NOT_TAKEN", "applies", "load"]

logger = logging.getLogger(__name__)

#: The first bytes of a zip file (torch.save's default format since 1.6).
_ZIP_MAGIC = b"PK\x03\x04"
#: What :func:`load` returns where this path does not apply.
NOT_TAKEN = object()
#: What torch reads as "on" in its TORCH_FORCE_*_WEIGHTS_ONLY_LOAD variables.
_TRUE = ("1", "y", "yes", "true")
_usable: bool | None = None


def _torch_loader_usable() -> bool:
    """Whether torch's zip loader takes an ``overall_storage`` (torch >= 2.1)."""
    global _usable
    if _usable is None:
        import torch.serialization as serialization

        loader = getattr(serialization, "_load", None)
        try:
            parameters = inspect.signature(loader).parameters if loader else {}
        except (TypeError, ValueError):
            parameters = {}
        _usable = (
            "overall_storage" in parameters
            and hasattr(serialization, "_weights_only_unpickler")
            and hasattr(serialization, "_open_zipfile_reader")
            and hasattr(serialization, "_is_torchscript_zip")
        )
    return _usable


def _weights_only_by_default() -> bool:
    """What ``torch.load(..., weights_only=None)`` would use (True from torch 2.6)."""
    import torch.serialization as serialization

    default = getattr(serialization, "_default_to_weights_only", None)
    forced_off = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    if default is None or forced_off:
        return False
    try:
        return bool(default(None))
    except TypeError:
        return False


def applies(torch_load_kwargs: dict[str, Any]) -> bool:
    """Whether a load with these ``torch.load`` arguments can take this path."""
    if set(torch_load_kwargs) - {"map_location", "weights_only"}:
        return False
    weights_only = torch_load_kwargs.get("weights_only")
    if weights_only is None:
        weights_only = _weights_only_by_default()
    return weights_only is True and _torch_loader_usable()


def _copying_load(uri: str, buffer: memoryview, why: str, map_location: Any) -> Any:
    """``torch.load`` of the downloaded bytes as a file (a copy), said once at DEBUG."""
    import torch

    logger.debug("%s: %s; loaded with torch.load from the downloaded bytes (a copy)", uri, why)
    with MemoryFile(uri, buffer) as f:
        return torch.load(f, map_location=map_location, weights_only=True)  # type: ignore[arg-type]


def load(store: ObjectStore, key: str, config: CheckpointConfig, map_location: Any) -> Any:
    """``torch.load(weights_only=True)`` of ``key``, its tensors views of the download.

    Returns :data:`NOT_TAKEN` for a gzip-encoded object (its bytes are decoded
    into a file by :mod:`._mapped` instead), before downloading it.

    Raises:
        NotFoundError: No such checkpoint, or it was rewritten mid-load.
        IntegrityError: The bytes do not match the object's CRC32C.
        CheckpointError: The object is empty, truncated or not a torch checkpoint.
        Exception: What ``torch.load`` raises otherwise (``weights_only`` refusing).
    """
    info = runtime.run(store.head(key))
    if info.transcoded:
        return NOT_TAKEN
    uri = store.uri(key)
    buffer = allocate(info.size)

    def load_downloaded() -> Any:
        try:
            return _load_bytes(uri, buffer, map_location)
        except Exception as exc:
            raise_if_unreadable(uri, cast(IO[bytes], MemoryFile(uri, buffer)), exc, size=info.size)
            raise

    # Unpickled while the bytes' CRC32C is computed, kept only if they match.
    return download(store, key, info, buffer, config, then=load_downloaded)


def _load_bytes(uri: str, buffer: memoryview, map_location: Any) -> Any:
    import torch
    import torch.serialization

    serialization: Any = torch.serialization  # its private loader (see the module's docstring)

    if len(buffer) < len(_ZIP_MAGIC) or buffer[: len(_ZIP_MAGIC)] != _ZIP_MAGIC:
        why = "not in torch's zip format (a legacy checkpoint?), which torch cannot map"
        return _copying_load(uri, buffer, why, map_location)
    with serialization._open_zipfile_reader(MemoryFile(uri, buffer)) as archive:
        if serialization._is_torchscript_zip(archive):
            return _copying_load(uri, buffer, "a TorchScript archive", map_location)
        overall = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
        try:
            return serialization._load(
                archive,
                map_location,
                serialization._weights_only_unpickler,
                overall_storage=overall,
                encoding="utf-8",
            )
        except pickle.UnpicklingError:
            pass  # torch.load says what weights_only refused, and how to allow it
    return _copying_load(uri, buffer, "weights_only refused it", map_location)
