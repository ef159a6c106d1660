"""An object's bytes kept as the pieces they were uploaded in.

A completed XML multipart upload was joined into one ``bytes`` when it
completed: a fresh allocation the size of the object, whose pages a VM
faults in at a few hundred MB/s. In a 4 GiB checkpoint save that join was
44% of the emulator's samples (issue 45), and it set the save's pace, which
no client could change. Google documents no cost of a completion that grows
with the object (https://cloud.google.com/storage/docs/multipart-uploads
says only that the parts are assembled into the object; how GCS stores them
is not said), so the model keeps the parts (or a resumable upload's chunks)
as they are, which answers every read the same: a ranged read copies the range it asks for, as a
``bytes`` slice did, and a whole read sends them one after another
(:class:`PiecesPayload`).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
from collections.abc import Iterable

import google_crc32c
from aiohttp import payload
from aiohttp.abc import AbstractStreamWriter

__all__ = [
    "Pieces",
    "PiecesPayload",
    "checksums",
    "chunks_of",
    "crc32c_b64",
    "md5_b64",
    "sliceable",
]


class Pieces:
    """Read-only bytes made of several ``bytes`` (no copy until read).

    Supports what the model reads an object's data with: ``len``, a slice
    (a copy, as a ``bytes`` slice is) and ``bytes()`` (a join).
    """

    __slots__ = ("_starts", "chunks", "size")

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = tuple(c for c in chunks if c)
        starts: list[int] = []
        pos = 0
        for c in self.chunks:
            starts.append(pos)
            pos += len(c)
        self._starts = starts
        self.size = pos

    @classmethod
    def of(cls, chunks: list[bytes]) -> bytes | Pieces:
        """``chunks`` as pieces, or as the one ``bytes`` they are."""
        kept = [c for c in chunks if c]
        return kept[0] if len(kept) == 1 else cls(kept) if kept else b""

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks)

    def __getitem__(self, key: slice) -> bytes:
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("Pieces take contiguous slices only")
        if start >= stop:
            return b""
        i = bisect.bisect_right(self._starts, start) - 1
        views: list[memoryview] = []
        while start < stop:
            chunk, base = self.chunks[i], self._starts[i]
            end = min(stop, base + len(chunk))
            views.append(memoryview(chunk)[start - base : end - base])
            start = end
            i += 1
        return bytes(views[0]) if len(views) == 1 else b"".join(views)


class PiecesPayload(payload.Payload):
    """A response body of :class:`Pieces`, written piece by piece (never joined)."""

    def __init__(self, pieces: Pieces) -> None:
        super().__init__(pieces, content_type=None)
        self.pieces = pieces
        self._size = len(pieces)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self.pieces).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return bytes(self.pieces)

    async def write(self, writer: AbstractStreamWriter) -> None:
        for chunk in self.pieces.chunks:
            await writer.write(chunk)


def chunks_of(data: bytes | Pieces) -> tuple[bytes, ...]:
    """``data``'s pieces: itself when it is one ``bytes``."""
    return data.chunks if isinstance(data, Pieces) else (data,)


def sliceable(data: bytes | bytearray | Pieces) -> memoryview | Pieces:
    """``data`` to take slices of without copying all of it."""
    return data if isinstance(data, Pieces) else memoryview(data)


def crc32c_b64(data: bytes | Pieces) -> str:
    """Base64 CRC32C (big-endian) of ``data``, as GCS reports it."""
    crc = 0
    for chunk in chunks_of(data):
        crc = google_crc32c.extend(crc, chunk)
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def md5_b64(data: bytes | Pieces) -> str:
    """Base64 MD5 of ``data``, as GCS reports it."""
    digest = hashlib.md5()
    for chunk in chunks_of(data):
        digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def checksums(data: bytes | Pieces) -> tuple[str, str]:
    """Base64 CRC32C (big-endian) and MD5 of ``data``, as GCS reports them."""
    return crc32c_b64(data), md5_b64(data)
