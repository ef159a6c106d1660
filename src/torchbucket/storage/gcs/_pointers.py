"""Pointers of a zonal bucket: the format of a pointer and of its data object's name.

A write to a zonal bucket larger than one message goes to a data object
``torchbucket-zonal-objects/<key>/<16 hex>`` (``<32 hex of sha256(key)>/<16
hex>`` where the name would pass 1024 bytes), and ``key`` becomes a pointer to
it: an empty object whose metadata names the data object, its generation, size
and CRC32C (see :mod:`._zonal`). Only the pointer at ``key`` ever names a data
object of ``key``; :mod:`._orphans` relies on it, and :func:`pointed` holds
every pointer to it: metadata naming any other object is not a pointer.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.crc32c import from_b64

__all__ = [
    "CRC",
    "GENERATION",
    "POINTER_PREFIX",
    "SIZE",
    "TARGET",
    "data_name",
    "hashed",
    "listed_info",
    "pointed",
    "pointer_key",
    "pointer_metadata",
]

#: Where the data objects of pointers live (in ``HIDDEN_PREFIXES``).
POINTER_PREFIX = "torchbucket-zonal-objects/"
TARGET = "torchbucket-target"
GENERATION = "torchbucket-target-generation"
SIZE = "torchbucket-target-size"
CRC = "torchbucket-target-crc32c"
_MAX_NAME = 1024
_ID = re.compile(r"[0-9a-f]{16}")
_DATA_NAME = re.compile(re.escape(POINTER_PREFIX) + r"(.+)/[0-9a-f]{16}", re.DOTALL)
_HASHED = re.compile(re.escape(POINTER_PREFIX) + r"[0-9a-f]{32}/[0-9a-f]{16}")


def pointer_metadata(target: str, generation: int, size: int, crc: str | None) -> dict[str, str]:
    """The metadata of a pointer to data object ``target`` (what :func:`pointed` reads)."""
    return {
        TARGET: target,
        GENERATION: str(generation),
        SIZE: str(size),
        **({CRC: crc} if crc else {}),
    }


def pointed(info_metadata: dict[str, str], key: str) -> tuple[str, int, int, str | None] | None:
    """``(data object, generation, size, crc32c)`` of the pointer at ``key``, else ``None``.

    ``info_metadata`` is the metadata of the object at ``key``; it points only
    at a data object of ``key``'s own (a name :func:`data_name` gives ``key``).
    """
    target = info_metadata.get(TARGET) or ""
    folder = _folder(key)
    # Metadata anyone with write access set must not send a read of this name
    # to another object of the bucket, nor have a replace or delete of this
    # name delete one: another key's data object least of all.
    if not target.startswith(folder) or not _ID.fullmatch(target[len(folder) :]):
        return None
    try:
        return (
            target,
            int(info_metadata[GENERATION]),
            int(info_metadata[SIZE]),
            info_metadata.get(CRC) or None,
        )
    except (KeyError, ValueError):
        return None


def _folder(key: str) -> str:
    """Where ``key``'s data objects are: under its name, or its digest where that is too long."""
    folder = f"{POINTER_PREFIX}{key}/"
    if len(folder.encode("utf-8", "surrogatepass")) + 16 <= _MAX_NAME:
        return folder
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{POINTER_PREFIX}{digest}/"


def data_name(key: str) -> str:
    """A new data object's name for ``key``."""
    return _folder(key) + uuid.uuid4().hex[:16]


def pointer_key(name: str) -> str | None:
    """The key whose pointer may name data object ``name``; ``None``: not a data object's name.

    For a hashed name (a key too long to spell out) this is the digest, which a
    pointer is at only by chance: see :func:`hashed`.
    """
    match = _DATA_NAME.fullmatch(name)
    return match.group(1) if match else None


def hashed(name: str) -> bool:
    """Whether ``name`` has the form of a long key's data object (its key is not in it)."""
    return _HASHED.fullmatch(name) is not None


def listed_info(doc: dict[str, Any], info: ObjectInfo) -> ObjectInfo:
    """A listed object's :class:`ObjectInfo`, a pointer's data object's under its name."""
    target = pointed(doc.get("metadata") or {}, info.name)
    if target is None:
        return info
    _, generation, size, crc = target
    if crc is not None:
        try:
            from_b64(crc)
        except ValueError:
            crc = None
    return ObjectInfo(info.name, size, generation, crc, info.storage_class)
