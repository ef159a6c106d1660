"""Loading a checkpoint without the deserialization copy: ranged GETs into file pages.

Where :mod:`._aliased` (``weights_only=True``, the default) does not apply,
``BucketCheckpoint.load`` downloads into file-backed pages (an anonymous
in-memory file, ``os.memfd_create``, on Linux; elsewhere a temporary file,
unlinked once torch has mapped it) and hands their path to
``torch.load(..., mmap=True)``: every tensor is then a view of the downloaded
pages (a private copy-on-write mapping) instead of a copy made by the zip
reader. What a load costs is then the download itself (receiving the bytes,
allocating their pages, the CRC32C over every byte) and ``torch.load``'s
unpickling; the copy of every byte into storages of torch's own, most of a
load's client CPU before (0.45-1.0 s per 512 MiB on the 2-core benchmark VM,
against 0.1 s mapped), is gone. The pages stay alive as long as any loaded
tensor does; a page written in place is copied on its first write.

The download is the one :func:`._reader.download` makes for
:class:`~torchbucket.checkpoint.CheckpointReader`: every range pinned to the
generation the metadata named, the CRC32C of the whole object checked before
``torch.load`` sees a byte, the pages prefaulted by the waiting thread.

Where torch cannot map (a checkpoint in torch's legacy format, which has no
records to map), the same downloaded bytes go to ``torch.load`` as a file
object, with one DEBUG line. Where no file can back the download (Windows),
the caller loads through :class:`CheckpointReader`.
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
import tempfile
from types import TracebackType
from typing import Any

from torchbucket import runtime
from torchbucket.checkpoint._reader import MemoryFile, download, load_decoded
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["MappedCheckpoint", "supported"]

logger = logging.getLogger(__name__)

#: The first bytes of a zip file (torch.save's default format since 1.6).
_ZIP_MAGIC = b"PK\x03\x04"


def _has_memfd() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create")


def supported() -> bool:
    """Whether this platform can load through file-backed pages (not Windows)."""
    return _has_memfd() or (os.name == "posix" and hasattr(mmap, "MAP_SHARED"))


def _backing_file() -> tuple[int, str | None]:
    """A new file to download into: its descriptor and, for a temporary file, its path."""
    if _has_memfd():
        return os.memfd_create("torchbucket-checkpoint", os.MFD_CLOEXEC), None
    fd, path = tempfile.mkstemp(prefix="torchbucket-checkpoint-")
    return fd, path


class MappedCheckpoint:
    """A checkpoint downloaded into file pages; close it once ``torch.load`` returned.

    Attributes:
        uri: The object.
        info: Its metadata; ``info.generation`` is the generation read.
    """

    def __init__(
        self, uri: str, info: ObjectInfo, fd: int, mapping: mmap.mmap, temp_path: str | None
    ) -> None:
        self.uri = uri
        self.info = info
        self._fd: int | None = fd
        self._mapping: mmap.mmap | None = mapping
        # A temporary file (not Linux): unlinked on close.
        self._temp_path = temp_path
        # The bytes held: the object's size, or a gzip object's decoded size.
        self.size = info.size

    @classmethod
    def load(cls, store: ObjectStore, key: str, config: CheckpointConfig) -> MappedCheckpoint:
        """Download ``key`` into a new in-memory (or temporary) file.

        Raises:
            NotFoundError: No such checkpoint, or it was rewritten mid-load.
            IntegrityError: The bytes do not match the object's CRC32C.
            OSError: The file could not be made or mapped.
        """
        info = runtime.run(store.head(key))
        decoded = load_decoded(store, key, info) if info.transcoded else None
        size = info.size if decoded is None else len(decoded)
        fd, temp_path = _backing_file()
        try:
            os.ftruncate(fd, max(size, 1))  # an empty object: no mapping has length 0
            mapping = mmap.mmap(fd, max(size, 1))
        except BaseException:
            os.close(fd)
            if temp_path is not None:
                os.unlink(temp_path)
            raise
        mapped = cls(store.uri(key), info, fd, mapping, temp_path)
        mapped.size = size
        try:
            view = memoryview(mapping)[:size]
            try:
                if decoded is None:
                    download(store, key, info, view, config)
                else:  # a gzip object, decoded (see load_decoded)
                    view[:] = decoded
            finally:
                view.release()
        except BaseException:
            mapped.close(discard=True)
            raise
        return mapped

    @property
    def path(self) -> str:
        """A path that opens the downloaded bytes (valid until ``close``)."""
        if self._fd is None:
            raise ValueError(f"the download of {self.uri} is closed")
        return self._temp_path or f"/proc/self/fd/{self._fd}"

    def is_zip(self) -> bool:
        """Whether the bytes are in torch's zip format (the only one torch can map)."""
        if self._mapping is None:
            raise ValueError(f"the download of {self.uri} is closed")
        return self.size >= len(_ZIP_MAGIC) and self._mapping[:4] == _ZIP_MAGIC

    def torch_load(self, **torch_load_kwargs: Any) -> Any:
        """``torch.load`` the bytes, mapped without a copy when torch can."""
        import torch

        if self.is_zip():
            return torch.load(self.path, mmap=True, **torch_load_kwargs)
        logger.debug(
            "%s: not in torch's zip format (a legacy checkpoint?); torch cannot map it, "
            "so it is loaded with a copy",
            self.uri,
        )
        assert self._mapping is not None
        view = memoryview(self._mapping)[: self.size]
        try:
            with MemoryFile(self.uri, view) as f:
                return torch.load(f, **torch_load_kwargs)  # type: ignore[arg-type]
        finally:
            view.release()

    def close(self, *, discard: bool = False) -> None:
        """Unmap and close the file; tensors loaded from it keep their own mapping.

        Args:
            discard: The download failed: nothing maps its pages but this.
        """
        if self._mapping is not None:
            mapping, self._mapping = self._mapping, None
            try:
                mapping.close()
            except BufferError:
                # A view of it survives (held by a traceback of a retried or
                # failed range): the mapping is unmapped when that view goes.
                # After a failed download its pages are given back now (they
                # read as zeros after); never after a load, whose tensors are
                # these pages.
                if discard and hasattr(mmap, "MADV_REMOVE"):
                    mapping.madvise(mmap.MADV_REMOVE)
                logger.debug("%s: download buffer still referenced; unmapped later", self.uri)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._temp_path is not None:
            path, self._temp_path = self._temp_path, None
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> MappedCheckpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
