"""Giving back a downloaded checkpoint's pages as ``torch.load`` copies them out.

``torch.load(f)`` on a file object copies every tensor's bytes out of the file
into storage of its own: with the whole checkpoint downloaded into memory
first, its peak was the download plus the tensors, twice the checkpoint. Each
tensor's bytes are one record of torch's zip format, and ``torch.load`` reads
each record once, with one ``readinto`` of exactly that record or of pieces
inside it. :class:`ConsumedPages` knows where the records' bytes lie (from the
zip's central directory) and, for a read inside one record, copies a piece at a
time and then hands that piece's source pages back to the kernel
(``MADV_DONTNEED`` on the private anonymous mapping the download went into): the
download shrinks as the tensors grow, and the peak is the checkpoint once plus
one piece.

A later read of released bytes (a second ``torch.load`` of the same reader
after ``seek(0)``, say) downloads them again, pinned to the generation read
first, so every read returns the checkpoint's bytes; only such a re-read costs
anything.
"""

from __future__ import annotations

import bisect
import ctypes
import io
import itertools
import logging
import mmap
import struct
import zipfile
from collections.abc import Callable

from torchbucket._madvise import MADV_DONTNEED, madvise

logger = logging.getLogger(__name__)

__all__ = ["ConsumedPages", "record_ranges"]

_PAGE = mmap.PAGESIZE
#: Bytes copied between two releases: the most a read holds twice at once.
PIECE = 4 << 20
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"


_madvise_fn = madvise


def supported() -> bool:
    """Whether pages can be handed back on this platform."""
    return _madvise_fn is not None


class _View(io.RawIOBase):
    """Just enough of a file over a memoryview for ``zipfile`` (small reads, no copy of the rest)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}
        self._position = max(0, base[whence] + offset)
        return self._position

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(target).cast("B")
        start = min(self._position, len(self._view))
        count = min(len(out), len(self._view) - start)
        out[:count] = self._view[start : start + count]
        self._position = start + count
        return count


def record_ranges(view: memoryview) -> list[tuple[int, int]]:
    """Where the stored (uncompressed) records of a zip file hold their bytes, sorted.

    Returns ``[]`` for anything that is not a readable zip file (torch's legacy
    format, for one): its pages are then never released.
    """
    if len(view) < 4 or view[:4] != _LOCAL_MAGIC:
        return []
    ranges: list[tuple[int, int]] = []
    try:
        with zipfile.ZipFile(_View(view)) as archive:
            for info in archive.infolist():
                if info.compress_type != zipfile.ZIP_STORED or not info.file_size:
                    continue
                offset = info.header_offset
                header = _LOCAL_HEADER.unpack(bytes(view[offset : offset + _LOCAL_HEADER.size]))
                if header[0] != _LOCAL_MAGIC:
                    return []
                start = offset + _LOCAL_HEADER.size + header[9] + header[10]
                end = start + info.file_size
                if end > len(view):
                    return []
                ranges.append((start, end))
    except (zipfile.BadZipFile, struct.error, ValueError, OSError):
        return []
    ranges.sort()
    for (_, end), (start, _) in itertools.pairwise(ranges):
        if start < end:  # overlapping records: not a layout to trust
            return []
    return ranges


class ConsumedPages:
    """The pages of a downloaded checkpoint that reads of its records gave back.

    Args:
        view: The download: a private anonymous mapping (see ``_reader.allocate``).
        records: :func:`record_ranges` of it.
        refill: ``refill(start, end)`` downloads ``view[start:end]`` again.
    """

    def __init__(
        self,
        view: memoryview,
        records: list[tuple[int, int]],
        refill: Callable[[int, int], None],
    ) -> None:
        self._view = view
        self._starts = [start for start, _ in records]
        self._records = records
        self._refill = refill
        self._base = _address(view)
        # Released page-aligned ranges (offsets into view), sorted, disjoint.
        self._released: list[tuple[int, int]] = []

    @property
    def released_bytes(self) -> int:
        return sum(end - start for start, end in self._released)

    def _record_of(self, start: int, end: int) -> tuple[int, int] | None:
        index = bisect.bisect_right(self._starts, start) - 1
        if index < 0:
            return None
        record = self._records[index]
        return record if record[0] <= start and end <= record[1] else None

    def restore(self, start: int, end: int) -> None:
        """Download again any released bytes of ``view[start:end]``."""
        if not self._released or start >= end:
            return
        kept: list[tuple[int, int]] = []
        for lo, hi in self._released:
            if hi <= start or lo >= end:
                kept.append((lo, hi))
                continue
            logger.debug("re-reading bytes %d-%d already handed to torch.load", lo, hi)
            self._refill(lo, hi)
        self._released = kept

    def copy(self, start: int, out: memoryview, prefault: Callable[[memoryview], None]) -> bool:
        """Copy ``view[start:start + len(out)]`` into ``out``, releasing it as it goes.

        Returns ``False`` (and copies nothing) unless the range lies inside
        one record: the caller then copies it as any other read.
        """
        end = start + len(out)
        if len(out) < _PAGE or self._record_of(start, end) is None:
            return False
        self.restore(start, end)
        for lo in range(start, end, PIECE):
            hi = min(lo + PIECE, end)
            target = out[lo - start : hi - start]
            prefault(target)
            target[:] = self._view[lo:hi]
            self._release(lo, hi)
        return True

    def _release(self, start: int, end: int) -> None:
        first = -(-(self._base + start) // _PAGE) * _PAGE
        last = (self._base + end) // _PAGE * _PAGE
        if last <= first or _madvise_fn is None:
            return
        if _madvise_fn(first, last - first, MADV_DONTNEED) != 0:
            return
        lo, hi = first - self._base, last - self._base
        if self._released and self._released[-1][1] == lo:
            self._released[-1] = (self._released[-1][0], hi)
        else:
            bisect.insort(self._released, (lo, hi))


def _address(view: memoryview) -> int:
    holder = (ctypes.c_char * len(view)).from_buffer(view)
    try:
        return ctypes.addressof(holder)
    finally:
        del holder
