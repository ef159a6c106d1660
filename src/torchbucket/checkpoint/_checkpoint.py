"""``BucketCheckpoint``: ``torch.save`` into a bucket and ``torch.load`` out of it."""

from __future__ import annotations

import contextlib
import io
import threading
from typing import IO, TYPE_CHECKING, Any, cast

from torchbucket import runtime
from torchbucket._checks import check_instance
from torchbucket._uri import parse_uri
from torchbucket.checkpoint import _aliased as aliased
from torchbucket.checkpoint import _mapped as mapped
from torchbucket.checkpoint._lent import collect as collect_lent
from torchbucket.checkpoint._reader import CheckpointReader
from torchbucket.checkpoint._unreadable import raise_if_unreadable
from torchbucket.checkpoint._writer import CheckpointWriter
from torchbucket.checkpoint._zip_crc import without_zip_crc
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.errors import InvalidURIError, NotFoundError
from torchbucket.storage import ObjectStore, store_for
from torchbucket.storage.checks import check_gcs_config

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketCheckpoint"]


class BucketCheckpoint:
    """Save checkpoints to, and load them from, ``gs://``, ``memory://`` or ``file://``.

    Example::

        checkpoint = BucketCheckpoint()
        with checkpoint.writer("gs://bucket/run/step-100.pt") as f:
            torch.save(model.state_dict(), f)
        with checkpoint.reader("gs://bucket/run/step-100.pt") as f:
            state = torch.load(f, weights_only=True)

    Stores are opened on first use per bucket and shared by every writer and
    reader of this object; it is safe to use from several threads.

    Args:
        config: Part sizes, parallelism and checks. Default ``CheckpointConfig()``.
        gcs: Endpoint, credentials and retries for ``gs://`` URIs.
            Default: ``GCSConfig()``.

    Raises:
        ConfigError: ``config`` or ``gcs`` is not a config object (for
            example a project name: gcs-torch-dataflux's
            ``DatafluxCheckpoint(project_name, bucket_name)`` is
            :class:`torchbucket.dataflux.dataflux_checkpoint.DatafluxCheckpoint`).
    """

    def __init__(
        self, *, config: CheckpointConfig | None = None, gcs: GCSConfig | None = None
    ) -> None:
        hint = ""
        if isinstance(config, str):
            hint = (
                "for gcs-torch-dataflux's DatafluxCheckpoint(project_name, bucket_name) use "
                "torchbucket.dataflux.dataflux_checkpoint.DatafluxCheckpoint"
            )
        check_instance(
            config, CheckpointConfig, owner="BucketCheckpoint", parameter="config", hint=hint
        )
        check_gcs_config(gcs, owner="BucketCheckpoint")
        self.config = config or CheckpointConfig()
        self.gcs = gcs
        self._stores: dict[tuple[str, str], ObjectStore] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Stores hold connections; a copy in another process opens its own.
        return {"config": self.config, "gcs": self.gcs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(config=state["config"], gcs=state["gcs"])  # type: ignore[misc]

    def open(self, uri: str) -> tuple[ObjectStore, str]:
        """The store ``uri`` lives in and the key inside it.

        Raises:
            InvalidURIError: ``uri`` is malformed or names no object.
        """
        parsed = parse_uri(uri)
        if not parsed.key or parsed.key.endswith("/"):
            raise InvalidURIError(f"{uri!r} names no object (a checkpoint needs a file name)")
        with self._lock:
            store = self._stores.get((parsed.scheme, parsed.bucket))
            if store is None:
                options: dict[str, Any] = {}
                if parsed.scheme == "gs" and self.gcs is not None:
                    options["config"] = self.gcs
                store, _ = store_for(parsed, **options)
                self._stores[(parsed.scheme, parsed.bucket)] = store
        return store, parsed.key

    def writer(
        self, uri: str, *, size_hint: int | None = None, content_type: str | None = None
    ) -> CheckpointWriter:
        """A binary file to ``torch.save`` into; the object appears on close.

        Args:
            uri: The checkpoint object.
            size_hint: The expected size in bytes, if known, so that a very large
                checkpoint starts with parts large enough for the part limit.
            content_type: The object's ``Content-Type``. Default ``None``:
                ``application/octet-stream``.

        Returns:
            A writer; use it in a ``with`` block. An exception inside the block
            aborts the save and nothing becomes visible.
        """
        store, key = self.open(uri)
        return CheckpointWriter(
            store, key, self.config, size_hint=size_hint, content_type=content_type
        )

    def reader(self, uri: str) -> CheckpointReader:
        """Download a checkpoint and return a seekable binary file over it.

        ``torch.load`` of it raises torch's own errors for bytes that are no
        checkpoint; :meth:`load` raises a ``CheckpointError`` naming ``uri``.

        Raises:
            NotFoundError: No such checkpoint (also a ``FileNotFoundError``), or
                it was rewritten while it was read.
            IntegrityError: The bytes do not match the object's CRC32C.
        """
        store, key = self.open(uri)
        return CheckpointReader.load(store, key, self.config)

    def save(self, obj: object, uri: str, **torch_save_kwargs: Any) -> None:
        """``torch.save(obj)`` to ``uri``.

        Unless ``config.torch_zip_crc32``, torch's CRC32 of each record (which
        ``torch.load`` never checks) is left out while it runs: the CRC32C of
        every byte guards the object instead, at a fraction of the CPU.

        The CPU tensors found in ``obj`` (through dicts, lists and tuples) are
        uploaded straight out of their memory, without a copy into part
        buffers, so they must not change until ``save`` returns: a tensor
        changed meanwhile (by training in another thread) fails the save with
        an ``IntegrityError`` rather than storing a torn checkpoint.
        """
        import torch

        skip = contextlib.nullcontext() if self.config.torch_zip_crc32 else without_zip_crc()
        with skip, self.writer(uri) as f:
            f.lend(collect_lent(obj))
            torch.save(obj, cast(IO[bytes], f), **torch_save_kwargs)

    def load(self, uri: str, **torch_load_kwargs: Any) -> Any:
        """``torch.load`` from ``uri``; keyword arguments go to ``torch.load``.

        The tensors are the downloaded bytes rather than copies of them: a
        load costs the download (ranges pinned to one generation, the CRC32C
        of every byte checked) and the unpickling, not a copy of every byte,
        and holds the checkpoint once.

        - ``weights_only=True`` (torch's default) with no argument but
          ``map_location``: the download goes into anonymous memory that
          torch's zip loader slices every tensor's storage out of, as
          ``torch.load(path, mmap=True)`` does out of a mapped file. The
          tensors are writable in place; the memory is freed when the last
          of them goes.
        - Otherwise (``weights_only=False``, ``pickle_module``...): the
          download goes into an in-memory file (a memfd on Linux, an unlinked
          temporary file on other POSIX systems) that
          ``torch.load(..., mmap=True)`` maps: a private copy-on-write
          mapping, a page written in place copied on its first write.

        ``map_location``: CPU (or none) costs nothing more; a CUDA device copies
        each tensor from the downloaded pages to the device (one host-to-device
        copy from pageable memory, as from a mapped local file), and the
        host pages are freed when ``torch.load`` returns.

        ``mmap=False`` loads through :meth:`reader` instead (a copy of every
        byte into torch's own storages; the peak is still about the checkpoint
        once, as the download hands each tensor's pages back while they are
        copied). So do checkpoints torch cannot map (its legacy format), with
        one DEBUG line, and platforms without such files (Windows).

        Raises:
            NotFoundError: No such checkpoint (also a ``FileNotFoundError``), or
                it was rewritten while it was read.
            IntegrityError: The bytes do not match the object's CRC32C.
            CheckpointError: The object is empty, truncated or not a torch
                checkpoint (chained from ``torch.load``'s error). Any other
                error of ``torch.load`` (a global ``weights_only`` refuses, say)
                is raised as it is.
        """
        import torch

        mapping = torch_load_kwargs.pop("mmap", None) is not False
        if mapping and aliased.applies(torch_load_kwargs):
            store, key = self.open(uri)
            loaded = aliased.load(store, key, self.config, torch_load_kwargs.get("map_location"))
            if loaded is not aliased.NOT_TAKEN:
                return loaded
        if mapping and mapped.supported():
            store, key = self.open(uri)
            with mapped.MappedCheckpoint.load(store, key, self.config) as fetched:
                try:
                    return fetched.torch_load(**torch_load_kwargs)
                except Exception as exc:
                    with open(fetched.path, "rb") as downloaded:
                        raise_if_unreadable(fetched.uri, downloaded, exc, size=fetched.size)
                    raise
        with self.reader(uri) as f:
            try:
                return torch.load(cast(IO[bytes], f), **torch_load_kwargs)
            except Exception as exc:
                size = f.seek(0, io.SEEK_END)
                raise_if_unreadable(f.uri, cast(IO[bytes], f), exc, size=size)
                raise

    def exists(self, uri: str) -> bool:
        """Whether the checkpoint object exists."""
        store, key = self.open(uri)
        try:
            runtime.run(store.head(key))
        except NotFoundError:
            return False
        return True

    def delete(self, uri: str, *, missing_ok: bool = False) -> None:
        """Delete a checkpoint object.

        Raises:
            NotFoundError: It does not exist and ``missing_ok`` is false.
        """
        store, key = self.open(uri)
        try:
            runtime.run(store.delete(key))
        except NotFoundError:
            if not missing_ok:
                raise

    def close(self) -> None:
        """Close the stores opened so far (they reopen on next use)."""
        with self._lock:
            stores = list(self._stores.values())
            self._stores.clear()
        for store in stores:
            runtime.run(store.close())
