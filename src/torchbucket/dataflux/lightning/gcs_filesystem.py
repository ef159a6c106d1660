"""dataflux's DCP storage (``GCSDistributedWriter`` / ``Reader``), on :mod:`torchbucket.dcp`.

::

    # from dataflux_pytorch.lightning.gcs_filesystem import GCSDistributedWriter
    from torchbucket.dataflux.lightning.gcs_filesystem import GCSDistributedWriter

    writer = GCSDistributedWriter("gcs://my-bucket/run/step-100", project_name="p")
    dcp.save(state_dict, checkpoint_id=path, storage_writer=writer)

The files are ``FileSystemWriter``'s layout, as dataflux's are, and the
metadata is written last (a save that died is refused on load instead of read
half-written). Needs no Lightning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, cast

from torchbucket import runtime
from torchbucket._checks import check_instance
from torchbucket._uri import is_bucket_uri, parse_uri, uri_text
from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.dataflux._common import check_names, gcs_config_for
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
from torchbucket.errors import ConfigError

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["GCSDistributedReader", "GCSDistributedWriter", "GCSFileSystem"]

logger = logging.getLogger(__name__)

Path = str | os.PathLike[str]

#: ``FileSystemWriter`` options dataflux passes on; only the two that mean
#: something here are used (see :class:`GCSDistributedWriter`).
_WRITER_OPTIONS = frozenset(
    {
        "single_file_per_rank",
        "sync_files",
        "thread_count",
        "per_thread_copy_ahead",
        "cache_staged_state_dict",
        "overwrite",
        "serialization_format",
        "_extensions",
    }
)
_READER_OPTIONS = frozenset({"_extension_registry"})


def _options(owner: str, given: dict[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword argument(s): {', '.join(unknown)}")
    ignored = sorted(set(given) - {"thread_count", "overwrite"})
    if ignored:
        logger.debug("%s: %s accepted and not used", owner, ", ".join(ignored))


class GCSFileSystem:
    """dataflux's file operations on ``gcs://`` / ``gs://`` paths (strings or ``Path``).

    Args:
        project_name: The GCP project (kept as an attribute).
        debug: Log each stream opened at INFO (dataflux printed it).
        storage_client: Accepted, ignored.
        gcs: Extension: how to reach GCS.
        checkpoint: Extension: the :class:`BucketCheckpoint` to use.
    """

    def __init__(
        self,
        project_name: str,
        debug: bool,
        storage_client: Any = None,
        *,
        gcs: GCSConfig | None = None,
        checkpoint: BucketCheckpoint | None = None,
    ) -> None:
        owner = type(self).__name__
        check_names(owner, project_name, storage_client)
        check_instance(checkpoint, BucketCheckpoint, owner=owner, parameter="checkpoint")
        self.project_name = project_name
        self.storage_client = None
        self.debug = bool(debug)
        self.checkpoint = checkpoint or BucketCheckpoint(gcs=gcs_config_for(owner, gcs))

    @contextmanager
    def create_stream(self, path: Path, mode: str) -> Iterator[IO[bytes]]:
        """A binary file to write (``"wb"``) or read (``"rb"``) the object at ``path``.

        Raises:
            ValueError: Another mode.
        """
        uri = uri_text(path)
        logger.log(logging.INFO if self.debug else logging.DEBUG, "stream %s %s", mode, uri)
        if mode == "wb":
            with self.checkpoint.writer(uri) as writer:
                yield cast(IO[bytes], writer)
        elif mode == "rb":
            with self.checkpoint.reader(uri) as reader:
                yield cast(IO[bytes], reader)
        else:
            raise ValueError(f"{uri}: create_stream supports 'rb' and 'wb', got {mode!r}")

    def concat_path(self, path: Path, suffix: str) -> str:
        """``path/suffix``, as a URI string."""
        return uri_text(path).rstrip("/") + "/" + suffix

    def init_path(self, path: Path) -> str:
        """``path`` as a URI string."""
        return uri_text(path)

    def rename(self, path: Path, new_path: Path) -> None:
        """Copy the object to ``new_path`` in the same bucket, then delete it.

        Raises:
            ConfigError: The buckets differ.
        """
        old, new = parse_uri(uri_text(path)), parse_uri(uri_text(new_path))
        if (old.scheme, old.bucket) != (new.scheme, new.bucket):
            raise ConfigError(f"rename {old} to {new}: both must be in the same bucket")
        store, key = self.checkpoint.open(str(old))
        runtime.run(store.copy(key, new.key))
        runtime.run(store.delete(key))

    def mkdir(self, path: Path) -> None:
        """Nothing: a bucket has no directories."""

    def exists(self, path: Path) -> bool:
        """Whether the object exists."""
        return self.checkpoint.exists(uri_text(path))

    def rm_file(self, path: Path) -> None:
        """Delete the object.

        Raises:
            NotFoundError: It does not exist (as dataflux's ``blob.delete``).
        """
        self.checkpoint.delete(uri_text(path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Path) -> bool:
        """Whether ``checkpoint_id`` is a bucket URI (a ``Path`` of one included)."""
        return is_bucket_uri(checkpoint_id)


class GCSDistributedWriter(BucketStorageWriter):
    """dataflux's DCP writer, as :class:`~torchbucket.dcp.BucketStorageWriter`.

    Args:
        path: The checkpoint's "directory": ``gcs://bucket/run/step`` or
            ``gs://...``, a string or a ``Path``.
        project_name: The GCP project (kept as an attribute).
        storage_client: Accepted, ignored.
        debug: As for :class:`GCSFileSystem`.
        gcs: Extension: how to reach GCS.
        **kwargs: ``FileSystemWriter``'s options, as dataflux passes them on:
            ``thread_count`` is the number of data files per rank (uploaded in
            parallel), ``overwrite`` as in torch; the others
            (``single_file_per_rank``, ``sync_files``, ``per_thread_copy_ahead``,
            ``cache_staged_state_dict``, ...) are accepted and not used.

    Raises:
        ConfigError: An argument is not of its type.
        TypeError: An option ``FileSystemWriter`` does not have.
    """

    def __init__(
        self,
        path: Path,
        project_name: str,
        storage_client: Any = None,
        debug: bool | None = False,
        *,
        gcs: GCSConfig | None = None,
        **kwargs: Any,
    ) -> None:
        _options(type(self).__name__, kwargs, _WRITER_OPTIONS)
        self.fs = GCSFileSystem(project_name, bool(debug), storage_client, gcs=gcs)
        super().__init__(
            path,
            bucket_checkpoint=self.fs.checkpoint,
            files_per_rank=kwargs.get("thread_count", 1),
            overwrite=kwargs.get("overwrite", True),
        )
        self.project_name = project_name
        self.sync_files = False


class GCSDistributedReader(BucketStorageReader):
    """dataflux's DCP reader, as :class:`~torchbucket.dcp.BucketStorageReader`.

    Args:
        path: The checkpoint's "directory", a string or a ``Path``.
        project_name: The GCP project (kept as an attribute).
        storage_client: Accepted, ignored.
        debug: As for :class:`GCSFileSystem`.
        gcs: Extension: how to reach GCS.
        **kwargs: ``FileSystemReader``'s options; accepted and not used.

    Raises:
        ConfigError: An argument is not of its type.
        TypeError: An option ``FileSystemReader`` does not have.
    """

    def __init__(
        self,
        path: Path,
        project_name: str,
        storage_client: Any = None,
        debug: bool | None = False,
        *,
        gcs: GCSConfig | None = None,
        **kwargs: Any,
    ) -> None:
        _options(type(self).__name__, kwargs, _READER_OPTIONS)
        self.fs = GCSFileSystem(project_name, bool(debug), storage_client, gcs=gcs)
        super().__init__(path, bucket_checkpoint=self.fs.checkpoint)
        self.project_name = project_name
