"""The running CRC32C of what a checkpoint writes or reads (see :mod:`torchbucket.storage.crc32c`)."""

from __future__ import annotations

from torchbucket.storage.crc32c import Crc32c

__all__ = ["Crc32c"]
