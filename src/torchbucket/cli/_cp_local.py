"""The local side of ``torchbucket cp``: a folder read by one policy, written only inside.

Uploads list a folder with :meth:`Local.items`: regular files are copied;
FIFOs, sockets and devices are skipped with one warning each (``--strict``
refuses them), so nothing waits on a FIFO or reads ``/dev/zero`` forever.
Symlinks follow one policy, as ``gcloud storage cp`` does: by default a
symlink to a file is copied as the file it points to, a symlink to a folder
is skipped with a warning, a broken one is skipped with a warning;
``--follow-symlinks`` also copies symlinked folders (each real folder once,
so a loop ends), ``--ignore-symlinks`` skips every symlink. Every open, read,
write and listing runs in a worker thread, never on the event loop's.

Downloads check every destination path with :meth:`Local.check_targets`
before anything is written: a name that would leave the folder (``..``,
absolute), two objects that map to one path (``a//b`` and ``a/b``), one
object that would be a file where another needs a folder (``a`` beside
``a/b``), and an existing symlink in the destination that leads outside it
are all refused, naming the objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import BinaryIO, Literal

from torchbucket.cli._common import EXIT_NOT_FOUND, CommandError, exit_code_for

__all__ = ["Local", "LocalOptions", "SymlinkPolicy", "local_error", "regular_file_size"]

logger = logging.getLogger(__name__)

_CHUNK = 8 << 20

#: ``files``: follow symlinks to files, skip symlinked folders with a warning
#: (the default); ``all``: follow both; ``none``: skip every symlink.
SymlinkPolicy = Literal["files", "all", "none"]


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """How an upload treats what is not a plain file.

    Attributes:
        symlinks: ``"files"`` (default), ``"all"`` or ``"none"``; see the module.
        strict: Refuse (exit 1, nothing copied) what would be skipped with a
            warning: special files, broken symlinks, symlinked folders.
    """

    symlinks: SymlinkPolicy = "files"
    strict: bool = False


def file_kind(mode: int) -> str:
    """``"a FIFO"``, ``"a socket"``, ``"a character device"``... for a ``st_mode``."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def local_error(exc: OSError, source: str, target: str) -> CommandError:
    """An ``OSError`` of one copy as one line naming both ends, with its exit code."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    errno = f" [Errno {exc.errno}]" if exc.errno is not None else ""
    return CommandError(f"cp {source} -> {target}: {reason}{errno}", exit_code=exit_code_for(exc))


def regular_file_size(path: str) -> int | None:
    """The size of ``path`` when it is a regular file, ``None`` when it is a folder.

    Raises:
        CommandError: It is missing (exit 3) or something else (a FIFO, a device).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CommandError(f"no such file or directory: {path}", exit_code=EXIT_NOT_FOUND) from None
    except OSError as exc:
        raise CommandError(f"cp {path}: {exc.strerror}", exit_code=exit_code_for(exc)) from exc
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        raise CommandError(f"cp {path}: it is {file_kind(st.st_mode)}, not a regular file")
    return st.st_size


class Local:
    """A folder (or one file) on this machine."""

    def __init__(self, path: str, options: LocalOptions | None = None) -> None:
        self.path = path
        self.options = options or LocalOptions()

    def __str__(self) -> str:
        return self.path

    def child(self, rel: str) -> str:
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("..", ".") for p in parts) or "\0" in rel:
            raise CommandError(
                f"refusing to write {rel!r} outside {self.path}: the name is absolute or "
                "has '..', '.' or NUL parts"
            )
        return os.path.join(self.path, *[p for p in parts if p])

    def describe(self, rel: str) -> str:
        return self.child(rel) if rel else self.path

    # --- uploads: what the folder holds, and reading it -------------------------

    async def items(self) -> list[tuple[str, int]]:
        return await asyncio.to_thread(self._walk)

    def _walk(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        self._visit(self.path, "", out, set())
        out.sort()
        return out

    def _visit(self, folder: str, rel: str, out: list[tuple[str, int]], seen: set[object]) -> None:
        try:
            st = os.stat(folder)
            key = (st.st_dev, st.st_ino)
            if key in seen:  # --follow-symlinks met a loop, or a folder twice
                self._skip(folder, "is a folder already copied (a symlink loop?)")
                return
            seen.add(key)
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            raise CommandError(
                f"cp: cannot list {folder}: {exc.strerror}", exit_code=exit_code_for(exc)
            ) from exc
        for entry in entries:
            name = rel + entry.name
            try:
                link = entry.is_symlink()
                st = entry.stat(follow_symlinks=False)
                if link:
                    if self.options.symlinks == "none":
                        logger.info("cp: skipping %s: a symlink (--ignore-symlinks)", entry.path)
                        continue
                    st = os.stat(entry.path)
            except FileNotFoundError:
                self._skip(entry.path, "is a broken symlink")
                continue
            except OSError as exc:
                self._skip(entry.path, f"cannot be read ({exc.strerror})")
                continue
            if stat.S_ISDIR(st.st_mode):
                if link and self.options.symlinks != "all":
                    self._skip(entry.path, "is a symlink to a folder (--follow-symlinks copies it)")
                else:
                    self._visit(entry.path, name + "/", out, seen)
            elif stat.S_ISREG(st.st_mode):
                out.append((name, st.st_size))
            else:
                self._skip(entry.path, f"is {file_kind(st.st_mode)}, not a regular file")

    def _skip(self, path: str, why: str) -> None:
        if self.options.strict:
            raise CommandError(f"cp: {path} {why}; refused (--strict), nothing copied")
        logger.warning("cp: skipping %s: it %s", path, why)

    def _open(self, rel: str) -> BinaryIO:
        # O_NONBLOCK: a file that became a FIFO since it was listed opens at once
        # (fstat then refuses it) instead of waiting for a writer forever.
        path = self.describe(rel)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise CommandError(f"cp {path}: it is now {file_kind(mode)}, not a regular file")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def _read_all(self, rel: str) -> bytes:
        with self._open(rel) as f:
            return f.read()

    async def read(self, rel: str) -> bytes:
        return await asyncio.to_thread(self._read_all, rel)

    async def stream(self, rel: str) -> AsyncIterator[bytes]:
        f = await asyncio.to_thread(self._open, rel)
        try:
            while chunk := await asyncio.to_thread(f.read, _CHUNK):
                yield chunk
        finally:
            f.close()

    # --- downloads: where each object goes, and writing it ----------------------

    def check_targets(self, targets: Iterable[tuple[str, str]]) -> None:
        """Refuse, before anything is written, destinations that collide or escape.

        Args:
            targets: ``(name relative to this folder, the source's URI)`` pairs.

        Raises:
            CommandError: A name leaves the folder; two sources map to one path;
                one would be a file where another needs a folder; a path exists
                as something else; or a symlink on the way leads outside.
        """
        files: dict[tuple[str, ...], str] = {}
        folders: dict[tuple[str, ...], str] = {}
        for rel, source in targets:
            self.child(rel)
            parts = tuple(p for p in rel.split("/") if p)
            path = os.path.join(self.path, *parts)
            if parts in files:
                raise _clash(f"{files[parts]} and {source} both map to {path}")
            if parts in folders:
                raise _clash(
                    f"{source} would be the file {path}, and {folders[parts]} needs it to be a folder"
                )
            files[parts] = source
            for i in range(1, len(parts)):
                folder = parts[:i]
                if folder in files:
                    path = os.path.join(self.path, *folder)
                    raise _clash(
                        f"{files[folder]} would be the file {path}, and {source} needs it to be a folder"
                    )
                folders.setdefault(folder, source)
        self._check_existing(files, folders)

    def _check_existing(
        self, files: dict[tuple[str, ...], str], folders: dict[tuple[str, ...], str]
    ) -> None:
        root = os.path.realpath(self.path)
        for folder in sorted(folders, key=len):
            path = os.path.join(self.path, *folder)
            if not os.path.lexists(path):
                continue
            if os.path.islink(path):
                real = os.path.realpath(path)
                if os.path.commonpath([root, real]) != root:
                    raise CommandError(
                        f"refusing to write {folders[folder]} through {path}: it is a symlink "
                        f"to {real}, outside {self.path}; nothing was copied"
                    )
            if not os.path.isdir(path):
                raise CommandError(
                    f"cannot write {folders[folder]}: {path} is a file, and the object needs "
                    "it to be a folder; nothing was copied"
                )
        for parts, source in files.items():
            path = os.path.join(self.path, *parts)
            if os.path.isdir(path) and not os.path.islink(path):
                raise CommandError(
                    f"cannot write {source} to {path}: a folder is there; nothing was copied"
                )

    async def write(self, rel: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self.describe(rel), data)

    def _write(self, path: str, data: bytes) -> None:
        tmp = self._tmp(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise

    async def write_stream(self, rel: str, chunks: AsyncIterator[bytes]) -> None:
        path = self.describe(rel)
        tmp = await asyncio.to_thread(self._tmp, path)
        try:
            f = await asyncio.to_thread(open, tmp, "wb")
            with f:
                async for chunk in chunks:
                    await asyncio.to_thread(f.write, chunk)
            await asyncio.to_thread(os.replace, tmp, path)
        except BaseException:
            await asyncio.to_thread(_unlink, tmp)
            raise

    @staticmethod
    def _tmp(path: str) -> str:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # The temporary name must fit where the final one fits: keep it short.
        return os.path.join(os.path.dirname(path), f".tbpart-{uuid.uuid4().hex[:12]}")

    async def close(self) -> None:
        return None


def _clash(what: str) -> CommandError:
    return CommandError(
        f"{what}; nothing was copied (copy one of them on its own, to another name)"
    )


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
