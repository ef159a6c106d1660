"""A small fsspec filesystem over torchbucket stores, for Lightning's path checks.

``ModelCheckpoint(dirpath="gs://...")`` asks fsspec for a filesystem for its
directory (``exists``, ``ls``, ``isdir``) even when a ``CheckpointIO`` does the
saving. fsspec maps ``gs://`` to ``gcsfs``, which torchbucket does not need; when
``gcsfs`` is not installed, :func:`register_filesystem` (run on import of
:mod:`torchbucket.lightning`) registers this filesystem for ``gs://`` instead.
Where ``gcsfs`` is installed it is left in charge (other code in the process may
rely on it), unless the user asks with ``register_filesystem(force=True)``: then
Lightning's checks go through the same store, endpoint and credentials as the
saves (an emulator that gcsfs does not know of, for one). ``memory://`` stays fsspec's
own in-memory filesystem, which does not see torchbucket's memory store:
Lightning's existence checks there always answer "no", which costs nothing but
the ``-v1`` version suffix and ``ckpt_path="last"`` lookups.

The filesystem uses the :class:`~torchbucket.checkpoint.BucketCheckpoint` (and
so the GCS configuration) of the most recently created
:class:`~torchbucket.lightning.BucketCheckpointIO`, or a default one.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.errors import NotFoundError
from torchbucket.storage.pages import list_all

__all__ = ["BucketFileSystem", "register_filesystem", "set_active_checkpoint"]

logger = logging.getLogger(__name__)

_active: BucketCheckpoint | None = None


def set_active_checkpoint(checkpoint: BucketCheckpoint) -> None:
    """Make the filesystem use ``checkpoint``'s stores and configuration."""
    global _active
    _active = checkpoint


def _checkpoint() -> BucketCheckpoint:
    global _active
    if _active is None:
        _active = BucketCheckpoint()
    return _active


class BucketFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """The fsspec operations Lightning needs, over ``gs://`` through torchbucket.

    Paths are ``bucket/key`` (fsspec strips the protocol). Directories are
    prefixes, as on any bucket: ``mkdir`` does nothing and a directory exists
    when an object lies under it.
    """

    protocol = ("gs", "gcs")
    root_marker = ""
    cachable = False

    def _uri(self, path: str) -> str:
        return f"gs://{self._strip_protocol(path)}"

    def _file_entry(self, path: str, size: int) -> dict[str, Any]:
        return {"name": self._strip_protocol(path), "size": size, "type": "file"}

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path).rstrip("/")
        bucket, _, key = path.partition("/")
        if not key:
            return {"name": bucket, "size": 0, "type": "directory"}
        store, key = _checkpoint().open(self._uri(path))
        try:
            info = runtime.run(store.head(key))
        except NotFoundError:
            page = runtime.run(store.list_page(key + "/", page_size=1))
            if page.objects:
                return {"name": path, "size": 0, "type": "directory"}
            raise
        return self._file_entry(path, info.size)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path).rstrip("/")
        bucket, _, prefix = path.partition("/")
        store, _ = _checkpoint().open(f"gs://{bucket}/x")
        prefix = prefix + "/" if prefix else ""
        entries: dict[str, dict[str, Any]] = {}
        for obj in runtime.run(list_all(store, prefix)):
            child, sep, _ = obj.name[len(prefix) :].partition("/")
            name = f"{bucket}/{prefix}{child}"
            if sep:
                entries.setdefault(name, {"name": name, "size": 0, "type": "directory"})
            else:
                entries[name] = self._file_entry(name, obj.size)
        if not entries:
            if prefix and self.isfile(path):
                return [self.info(path)] if detail else [path]
            if prefix:
                raise FileNotFoundError(f"gs://{path}: no such object or prefix")
        listing = sorted(entries.values(), key=lambda entry: entry["name"])
        return listing if detail else [entry["name"] for entry in listing]

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        return None

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        return None

    def rm_file(self, path: str) -> None:
        _checkpoint().delete(self._uri(path))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            return _checkpoint().reader(self._uri(path))
        if "w" in mode:
            return _checkpoint().writer(self._uri(path))
        raise ValueError(f"{self._uri(path)}: mode {mode!r} is not supported (only rb and wb)")


def register_filesystem(*, force: bool = False) -> bool:
    """Serve ``gs://`` and ``gcs://`` in fsspec through torchbucket unless ``gcsfs`` is installed.

    Args:
        force: Take ``gs://`` and ``gcs://`` over from an installed ``gcsfs``
            too, for the whole process.

    Returns:
        Whether this filesystem is now fsspec's ``gs://`` implementation.
    """
    if not force and importlib.util.find_spec("gcsfs") is not None:
        logger.debug("gcsfs is installed; leaving fsspec's gs:// to it")
        return False
    for protocol in BucketFileSystem.protocol:
        fsspec.register_implementation(protocol, BucketFileSystem, clobber=True)
    return True
