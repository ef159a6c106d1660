"""CRC32C over large buffers without copying them.

``google_crc32c``'s extension only accepts ``bytes`` (its argument parser
rejects ``bytearray`` and ``memoryview``), so checksumming a part buffer through
it costs a copy of every byte and holds the GIL. Its wheel ships the C library
it wraps; calling that through :mod:`ctypes` checksums a writable buffer in
place and releases the GIL meanwhile, so other threads (the upload loop, the
writer of a checkpoint) keep running. Measured on a 512 MiB checkpoint save:
checksumming its 8 MiB parts through copies of 1 MiB pieces cost the upload
loop 75 ms of CPU, of which 31 ms were the copies. Read-only buffers other than
``bytes``, and every buffer where the library cannot be found, take the copying
path, a piece at a time.
"""

from __future__ import annotations

import base64
import ctypes
import glob
import logging
import os
from collections.abc import Callable

import google_crc32c

__all__ = ["Crc32c", "b64", "extend"]

logger = logging.getLogger(__name__)

_Extend = Callable[[int, int, int], int]

#: Bytes copied at a time where a buffer cannot be checksummed in place.
_PIECE = 1 << 20


def _load_native() -> _Extend | None:
    package = os.path.dirname(google_crc32c.__file__)
    for path in sorted(glob.glob(os.path.join(package, os.pardir, "google_crc32c.libs", "*"))):
        if "crc32c" not in os.path.basename(path):
            continue
        try:
            library = ctypes.CDLL(path)
            function = library.crc32c_extend
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        function.restype = ctypes.c_uint32
        return function  # type: ignore[no-any-return]
    logger.debug("native crc32c library not found; checksumming through copies")
    return None


_native: _Extend | None = _load_native()


def extend(crc: int, data: bytes | bytearray | memoryview) -> int:
    """The CRC32C of what ``crc`` covered followed by ``data``."""
    if isinstance(data, bytes):
        return google_crc32c.extend(crc, data)  # type: ignore[no-any-return]
    view = memoryview(data).cast("B")
    if not len(view):
        return crc
    if _native is not None and not view.readonly and view.c_contiguous:
        array = (ctypes.c_char * len(view)).from_buffer(view)
        try:
            return _native(crc, ctypes.addressof(array), len(view))
        finally:
            del array
    for start in range(0, len(view), _PIECE):
        crc = google_crc32c.extend(crc, bytes(view[start : start + _PIECE]))
    return crc


def b64(crc: int) -> str:
    """A CRC32C value as GCS reports it: base64 of the 4 big-endian bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


class Crc32c:
    """A running CRC32C, fed with ``update`` and read as GCS reports it."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Extend the checksum with ``data``."""
        self._value = extend(self._value, data)

    @property
    def value(self) -> int:
        """The checksum as an unsigned 32-bit integer."""
        return self._value

    def b64(self) -> str:
        """The checksum as GCS reports it: base64 of the big-endian 4 bytes."""
        return b64(self._value)
