"""Files as objects, for :class:`~torchbucket.storage.local.LocalStore`.

A key is an absolute path without its leading ``/``. Writes are atomic: bytes go
to a hidden temporary sibling (``.<name>.tbtmp-<id>``) that is renamed over the
destination. An object's generation is its modification time in nanoseconds,
kept strictly increasing per object. Multipart uploads stage their parts in a
hidden sibling directory ``.<name>.tbupload-<id>/``. ``OSError`` becomes a
:mod:`torchbucket.errors` type in one place, :func:`os_error`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator

from torchbucket.errors import (
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    StorageError,
)
from torchbucket.storage.base import MultipartUpload, ObjectInfo

__all__ = [
    "TEMP_MARK",
    "UPLOAD_MARK",
    "check_generation",
    "commit",
    "copier",
    "current_generation",
    "hidden",
    "info",
    "install",
    "os_error",
    "part_etag",
    "path_of",
    "sender",
    "staging",
    "target",
    "unlink_quietly",
    "uri",
    "walk",
    "walk_uploads",
    "write_all",
]


def uri(key: str) -> str:
    """``file:///key``."""
    return f"file:///{key}"


def path_of(key: str) -> str:
    """The filesystem path of ``key``."""
    return "/" + key


UPLOAD_MARK = ".tbupload-"
TEMP_MARK = ".tbtmp-"


def hidden(name: str) -> bool:
    return name.startswith(".") and (UPLOAD_MARK in name or TEMP_MARK in name)


def os_error(exc: OSError, operation: str, uri: str) -> StorageError:
    """The one translation of ``OSError`` into :mod:`torchbucket.errors`."""
    what = exc.strerror or type(exc).__name__
    if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return NotFoundError("object does not exist", operation=operation, uri=uri)
    if isinstance(exc, PermissionError):
        return PermissionDeniedError(what, operation=operation, uri=uri)
    if exc.errno == errno.ENAMETOOLONG:
        return StorageError("name too long for the filesystem", operation=operation, uri=uri)
    return StorageError(what, operation=operation, uri=uri)


def part_etag(size: int, generation: int | None) -> str:
    # Size and write time identify a part file's contents without reading it.
    return f"{generation or 0:x}-{size}"


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def info(key: str, st: os.stat_result, crc32c: str | None = None) -> ObjectInfo:
    return ObjectInfo(key, st.st_size, st.st_mtime_ns, crc32c, "STANDARD")


def current_generation(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0


def walk(prefix: str) -> dict[str, ObjectInfo]:
    directory, _, _ = prefix.rpartition("/")
    found: dict[str, ObjectInfo] = {}
    stack = ["/" + directory]
    while stack:
        path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if hidden(entry.name):
                continue
            key = entry.path[1:]
            try:
                if entry.is_dir(follow_symlinks=False):
                    # Descend only where names can still start with the prefix.
                    if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append(entry.path)
                elif key.startswith(prefix) and entry.is_file():
                    found[key] = info(key, entry.stat())
            except FileNotFoundError:  # removed while we walked
                continue
    return found


def check_generation(st: os.stat_result, generation: int | None, operation: str, uri: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotFoundError("object does not exist", operation=operation, uri=uri)
    if generation is not None and st.st_mtime_ns != generation:
        raise NotFoundError(f"generation {generation} is gone", operation=operation, uri=uri)


def target(key: str, operation: str) -> tuple[str, str]:
    """The path of ``key`` and a fresh hidden temporary path beside it."""
    if not key or key.endswith("/"):
        raise StorageError("not an object name", operation=operation, uri=uri(key))
    path = path_of(key)
    directory, _, name = path.rpartition("/")
    return path, f"{directory}/.{name[:150]}{TEMP_MARK}{uuid.uuid4().hex[:12]}"


def install(key: str, tmp: str, operation: str, if_generation_match: int | None) -> ObjectInfo:
    """Rename the written ``tmp`` over ``key`` (the temporary goes either way)."""
    path = path_of(key)
    installed = False
    try:
        current = current_generation(path)
        if if_generation_match is not None and current != if_generation_match:
            raise PreconditionFailedError(
                f"generation is {current}, expected {if_generation_match}",
                operation=operation,
                uri=uri(key),
                status=412,
            )
        # Generations must grow even when writes land in one clock tick.
        generation = max(time.time_ns(), current + 1)
        os.utime(tmp, ns=(generation, generation))
        os.replace(tmp, path)
        installed = True
        return info(key, os.stat(path))
    finally:
        if not installed:
            unlink_quietly(tmp)


def commit(
    key: str,
    write: Callable[[int], None],
    operation: str,
    if_generation_match: int | None = None,
) -> ObjectInfo:
    """Write a temporary sibling with ``write(fd)``, then rename it into place."""
    path, tmp = target(key, operation)
    try:
        os.makedirs(path.rpartition("/")[0] or "/", exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        written = False
        try:
            write(fd)
            written = True
        finally:
            os.close(fd)
            if not written:
                unlink_quietly(tmp)
        return install(key, tmp, operation, if_generation_match)
    except OSError as exc:
        raise os_error(exc, operation, uri(key)) from exc


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def copier(*paths: str) -> Callable[[int], None]:
    """A ``write(fd)`` that appends the files at ``paths`` in order."""

    def write(fd: int) -> None:
        for path in paths:
            with open(path, "rb") as src:
                sender(src.fileno())(fd)

    return write


def sender(src: int) -> Callable[[int], None]:
    """A ``write(fd)`` that appends the whole open file ``src``."""

    def write(fd: int) -> None:
        size = os.fstat(src).st_size
        offset = 0
        while offset < size:
            sent = os.sendfile(fd, src, offset, size - offset)
            if sent == 0:
                break
            offset += sent

    return write


def staging(key: str, upload_id: str) -> str:
    directory, _, name = path_of(key).rpartition("/")
    return f"{directory}/.{name}{UPLOAD_MARK}{upload_id}"


def walk_uploads(prefix: str) -> Iterator[MultipartUpload]:
    directory, _, _ = prefix.rpartition("/")
    stack = ["/" + directory]
    while stack:
        path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name.startswith(".") and UPLOAD_MARK in entry.name:
                name, _, upload_id = entry.name[1:].rpartition(UPLOAD_MARK)
                key = f"{path[1:]}/{name}" if path != "/" else name
                if key.startswith(prefix):
                    yield MultipartUpload(key, upload_id, entry.stat().st_mtime)
            elif not hidden(entry.name):
                key = entry.path[1:]
                if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                    stack.append(entry.path)
