"""Loading a checkpoint: parallel ranged GETs into one buffer, read as a file.

The object's metadata is read first; every range is then pinned to that
generation, so a checkpoint rewritten during the load fails the load instead of
mixing bytes of two checkpoints. The ranges land in one preallocated buffer
(never returned from a coroutine: on Python 3.11 the loop reprs a finished
coroutine's result while restoring the SIGINT handler, 15 s of CPU for a 512
MiB buffer), which :class:`CheckpointReader` serves to ``torch.load`` without
another copy.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TypeVar, cast

from torchbucket import runtime
from torchbucket.checkpoint import _consumed
from torchbucket.checkpoint._pages import (
    MAPPED_MIN,
    PREFAULT_MIN,
    allocate,
    never,
    prefault,
    prefault_target,
    run_filling,
)
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.capabilities import SupportsCheckedReads
from torchbucket.storage.crc32c import Crc32c, b64, combine
from torchbucket.storage.ranges import fetch_ranges, split_ranges

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Whole-object reads before a CRC32C mismatch is reported.
_LOAD_ATTEMPTS = 2
#: A last range shorter than range_size // _TAIL joins the range before it.
_TAIL = 8

__all__ = [
    "CheckpointReader",
    "MemoryFile",
    "download",
    "fetch_ranges",
    "load_decoded",
    "split_ranges",
]


class MemoryFile(io.BufferedIOBase):
    """A read-only, seekable binary file over a buffer, without copying it.

    Args:
        uri: What the bytes are, for messages.
        buffer: The bytes; released on ``close``.
    """

    def __init__(self, uri: str, buffer: memoryview) -> None:
        super().__init__()
        self.uri = uri
        self._view: memoryview | None = buffer
        self._position = 0
        # Set for a download whose records' pages reads give back (_consumed).
        self._pages: _consumed.ConsumedPages | None = None

    def _live(self) -> memoryview:
        if self._view is None:
            raise ValueError(f"I/O operation on a closed checkpoint reader ({self.uri})")
        return self._view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def getbuffer(self) -> memoryview:
        """The whole checkpoint, without a copy (valid until ``close``)."""
        view = self._live()
        if self._pages is not None:
            self._pages.restore(0, len(view))
        return view

    def tell(self) -> int:
        self._live()
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        size = len(self._live())
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def read(self, size: int | None = -1) -> bytes:
        view = self._live()
        start = min(self._position, len(view))
        end = len(view) if size is None or size < 0 else min(start + size, len(view))
        self._position = max(self._position, end)
        if self._pages is not None:
            self._pages.restore(start, end)
        return bytes(view[start:end])

    read1 = read

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        view = self._live()
        out = memoryview(target).cast("B")
        start = min(self._position, len(view))
        count = min(len(out), len(view) - start)
        if self._pages is not None:
            if self._pages.copy(start, out[:count], prefault_target):
                # A record's bytes: copied a piece at a time, each piece's pages
                # then given back (peak: the checkpoint once, not twice).
                self._position = start + count
                return count
            self._pages.restore(start, start + count)
        if count >= PREFAULT_MIN:
            # torch.load reads each tensor into fresh memory: its pages in one
            # call cost less than a fault per 4 KiB page during the copy
            # (0.35 -> 0.28 s for the benchmark's 512 MiB state dict).
            prefault(out[:count], count, never)
        out[:count] = view[start : start + count]
        self._position = start + count
        return count

    readinto1 = readinto  # type: ignore[assignment]

    def close(self) -> None:
        self._view = None
        self._pages = None
        super().close()

    def __enter__(self) -> MemoryFile:
        self._live()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class CheckpointReader(MemoryFile):
    """A read-only, seekable binary file over a checkpoint loaded into memory.

    Made by :meth:`BucketCheckpoint.reader`, which downloads the whole object
    before returning. ``close`` (or leaving the ``with`` block) frees the buffer.

    Attributes:
        uri: The object.
        info: Its metadata; ``info.generation`` is the generation read.
    """

    def __init__(self, uri: str, info: ObjectInfo, buffer: memoryview) -> None:
        super().__init__(uri, buffer)
        self.info = info

    def __enter__(self) -> CheckpointReader:
        self._live()
        return self

    @classmethod
    def load(cls, store: ObjectStore, key: str, config: CheckpointConfig) -> CheckpointReader:
        """Download ``key`` into a new buffer and open a reader over it.

        Raises:
            NotFoundError: No such checkpoint, or it was rewritten mid-load.
            IntegrityError: The bytes do not match the object's CRC32C.
        """
        info = runtime.run(store.head(key))
        if info.transcoded:
            return cls(store.uri(key), info, memoryview(load_decoded(store, key, info)))
        buffer = allocate(info.size)
        download(store, key, info, buffer, config)
        reader = cls(store.uri(key), info, buffer)
        if info.size >= MAPPED_MIN and _consumed.supported():
            # Only a private anonymous mapping (allocate) can give pages back.
            records = _consumed.record_ranges(buffer)
            if records:

                def refill(start: int, end: int) -> None:
                    download_range(store, key, info, buffer[start:end], start, config)

                reader._pages = _consumed.ConsumedPages(buffer, records, refill)
        return reader


@contextlib.contextmanager
def _same_generation(store: ObjectStore, key: str, info: ObjectInfo) -> Iterator[None]:
    """Say "deleted or rewritten while it was read" where a read of ``info``'s generation finds none."""
    try:
        yield
    except NotFoundError as exc:
        raise NotFoundError(
            f"the checkpoint was deleted or rewritten while it was read "
            f"(generation {info.generation}); load it again",
            operation="checkpoint load",
            uri=store.uri(key),
        ) from exc


def load_decoded(store: ObjectStore, key: str, info: ObjectInfo) -> bytes:
    """The bytes of a checkpoint stored with ``Content-Encoding: gzip``, decoded.

    What ``google-cloud-storage``'s ``download_as_bytes()`` returns for it. Its
    ranges cannot be read in parallel (the stored bytes' offsets are not the
    decoded ones, https://cloud.google.com/storage/docs/transcoding), so it is
    one whole read, whose stored bytes the store checks against their CRC32C
    before decoding them.

    Raises:
        NotFoundError: The object is gone, or was rewritten since ``info`` was read.
    """
    with _same_generation(store, key, info):
        return runtime.run(store.get(key, generation=info.generation))


def download_range(
    store: ObjectStore,
    key: str,
    info: ObjectInfo,
    view: memoryview,
    start: int,
    config: CheckpointConfig,
) -> None:
    """Fill ``view`` with generation ``info.generation`` of ``key`` from ``start`` on.

    Raises:
        NotFoundError: The object is gone, or was rewritten since ``info`` was read.
        IntegrityError: A range came back short.
    """
    with _same_generation(store, key, info):
        runtime.run(
            fetch_ranges(
                store,
                [(key, view, start)],
                generation=info.generation,
                chunk_size=config.range_size,
                parallelism=config.reads_in_flight,
            )
        )


class _CheckedRanges:
    """A store for :func:`fetch_ranges` that keeps each range's CRC32C.

    Where the store sends a checksum with every chunk and checks each on
    arrival (``SupportsCheckedReads``: GCS's gRPC path), the object's CRC32C
    is combined from the ranges' instead of computed again over the download
    once the last byte is in (a 128 MiB load from the emulator's zonal bucket:
    1.57 -> 1.42 client CPU ms/MiB without that pass, in one process).
    """

    def __init__(self, store: SupportsCheckedReads) -> None:
        self._store = store
        self._ranges: dict[int, tuple[int, int | None]] = {}

    def uri(self, key: str = "") -> str:
        return cast(ObjectStore, self._store).uri(key)

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        got, crc = await self._store.get_into_checked(
            key, buffer, start=start, generation=generation
        )
        self._ranges[start] = (got, crc)
        return got

    def combined(self, size: int) -> int | None:
        """The CRC32C of ``[0, size)`` from the ranges', or ``None`` where one lacks it."""
        at = value = 0
        for start in sorted(self._ranges):
            got, crc = self._ranges[start]
            if start != at or crc is None:
                return None
            value, at = combine(value, crc, got), at + got
        return value if at == size else None


def load_ranges(size: int, range_size: int) -> list[tuple[int, int]]:
    """:func:`split_ranges`, a last range under an eighth of ``range_size`` joined to the one before.

    A checkpoint is tensors of round sizes plus a few KiB of pickle and zip
    records: 128 MiB of tensors in 8 MiB ranges were 17 ranges, the last of
    1.5 KiB, which over gRPC opened a bidi stream of its own (a stream takes
    16 ranges) and over the JSON API cost a GET of its own.
    """
    ranges = split_ranges(size, range_size)
    if len(ranges) > 1 and ranges[-1][1] - ranges[-1][0] < range_size // _TAIL:
        ranges[-2:] = [(ranges[-2][0], size)]
    return ranges


def download(
    store: ObjectStore,
    key: str,
    info: ObjectInfo,
    buffer: memoryview,
    config: CheckpointConfig,
    then: Callable[[], T] | None = None,
) -> T | None:
    """Fill ``buffer`` (``info.size`` bytes) with generation ``info.generation`` of ``key``.

    Returns ``then()`` (``None`` without it), called once the bytes are in.
    Where their CRC32C is computed over the buffer (no per-range checksums
    came), ``then`` runs while another thread computes it (the native CRC32C
    runs without the GIL), and what it returned or raised is given only once
    every byte matched; on a mismatch it is dropped, the bytes are read again
    and ``then`` runs again. So ``then`` must be safe on damaged bytes: for a
    load, torch's weights-only loader, which must be safe on any bytes anyway
    (a CRC32C tells damage on the way, not a hostile writer, who stores a
    matching one).

    Raises:
        NotFoundError: The object is gone, or was rewritten since ``info`` was read.
        IntegrityError: The bytes do not match the object's CRC32C (after a
            second read).
    """
    uri = store.uri(key)
    verify = config.verify_crc32c and info.crc32c is not None
    ranges = load_ranges(len(buffer), config.range_size)
    jobs = [(key, buffer[lo:hi], lo) for lo, hi in ranges]
    longest = max((hi - lo for lo, hi in ranges), default=1)
    for attempt in range(1, _LOAD_ATTEMPTS + 1):
        checked = (
            _CheckedRanges(store) if verify and isinstance(store, SupportsCheckedReads) else None
        )
        with _same_generation(store, key, info):
            run_filling(
                fetch_ranges(
                    cast(ObjectStore, checked or store),
                    jobs,
                    generation=info.generation,
                    chunk_size=longest,  # each job one range
                    parallelism=config.reads_in_flight,
                ),
                buffer,
                config.range_size,
            )
        if not verify:
            return then() if then is not None else None
        value = checked.combined(len(buffer)) if checked is not None else None
        if value is None:  # no per-chunk checksums came: the bytes read again
            got, result = _checksum_beside(buffer, then, info.crc32c)
            if got == info.crc32c:
                return result
        elif (got := b64(value)) == info.crc32c:
            return then() if then is not None else None
        # A range is checked only for its length on the way in, so which one
        # was damaged is unknown: read them all again.
        message = f"crc32c of the bytes read is {got}, the object's is {info.crc32c}"
        if attempt == _LOAD_ATTEMPTS:
            raise IntegrityError(message, operation="checkpoint load", uri=uri)
        logger.warning("%s: %s; reading it again", uri, message)
    raise AssertionError("unreachable")  # pragma: no cover


def _checksum_beside(
    buffer: memoryview, then: Callable[[], T] | None, expected: str | None
) -> tuple[str, T | None]:
    """The CRC32C of ``buffer`` (base64), and what ``then()``, run meanwhile, returned.

    What ``then`` raised is raised where the CRC32C is ``expected``, dropped
    where not; no variable holds it (a frame that did would be a reference
    cycle keeping the download alive until the garbage collector ran).
    """
    crc = Crc32c()
    if then is None:
        crc.update(buffer)
        return b64(crc.value), None
    thread = threading.Thread(target=crc.update, args=(buffer,), name="torchbucket-crc32c")
    thread.start()
    try:
        result = then()
    except Exception:
        thread.join()
        if b64(crc.value) == expected:
            raise
        return b64(crc.value), None  # made of damaged bytes: dropped with them
    finally:
        thread.join()
    return b64(crc.value), result
