"""``dataflux_pytorch.dataflux_checkpoint``, on :class:`~torchbucket.checkpoint.BucketCheckpoint`.

::

    # from dataflux_pytorch import dataflux_checkpoint
    from torchbucket.dataflux import dataflux_checkpoint

    ckpt = dataflux_checkpoint.DatafluxCheckpoint(project_name="p", bucket_name="my-bucket")
    with ckpt.writer("checkpoints/epoch0.ckpt") as writer:
        torch.save(model.state_dict(), writer)
    with ckpt.reader("checkpoints/epoch0.ckpt") as reader:
        state_dict = torch.load(reader)

Unlike dataflux, a save does not stage the whole checkpoint in memory first
(parts upload while ``torch.save`` writes), and the object appears only when
the ``with`` block ends without an exception.

``torch.load(reader)`` copies every tensor's bytes out of the downloaded ones
(torch maps only a path, never a file object); the extension
``ckpt.load("checkpoints/epoch0.ckpt")`` downloads into an in-memory file that
``torch.load(..., mmap=True)`` maps instead, without that copy
(:meth:`BucketCheckpoint.load`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchbucket._checks import check_instance
from torchbucket.checkpoint import BucketCheckpoint, CheckpointReader, CheckpointWriter
from torchbucket.dataflux._common import bucket_uri, check_names, gcs_config_for

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["DatafluxCheckpoint"]


class DatafluxCheckpoint:
    """dataflux's checkpoint interface: bucket-relative object names, ``writer`` and ``reader``.

    Args:
        project_name: The GCP project (kept as an attribute).
        bucket_name: The bucket (or, as an extension, a torchbucket URI such
            as ``memory://name`` or ``file:///dir``).
        storage_client: Accepted, ignored: requests go through aiohttp.
        gcs: Extension: how to reach GCS.
        checkpoint: Extension: the :class:`BucketCheckpoint` to use (its
            configuration: part sizes, parallelism).

    Raises:
        ConfigError: An argument is not of its type.
    """

    def __init__(
        self,
        project_name: str,
        bucket_name: str,
        storage_client: Any = None,
        *,
        gcs: GCSConfig | None = None,
        checkpoint: BucketCheckpoint | None = None,
    ) -> None:
        owner = type(self).__name__
        check_names(owner, project_name, storage_client, bucket_name)
        check_instance(checkpoint, BucketCheckpoint, owner=owner, parameter="checkpoint")
        self.project_name = project_name
        self.bucket_name = bucket_name
        self.storage_client = None
        self.checkpoint = checkpoint or BucketCheckpoint(gcs=gcs_config_for(owner, gcs))

    def uri(self, object_name: str) -> str:
        """The URI of ``object_name`` (bucket-relative, as in dataflux)."""
        check_instance(
            object_name, str, owner=type(self).__name__, parameter="object_name", optional=False
        )
        return bucket_uri(self.bucket_name, object_name)

    def writer(self, object_name: str) -> CheckpointWriter:
        """A binary file to ``torch.save`` into; the object appears when it closes."""
        return self.checkpoint.writer(self.uri(object_name))

    def load(self, object_name: str, **torch_load_kwargs: Any) -> Any:
        """Extension: ``torch.load`` the object, its tensors mapped from the download.

        What :meth:`BucketCheckpoint.load` does: the same checks as
        :meth:`reader` (CRC32C of every byte, one generation), without the copy
        ``torch.load(reader)`` makes of every tensor.

        Raises:
            NotFoundError: No such object (also a ``FileNotFoundError``).
            IntegrityError: The bytes do not match the object's CRC32C.
            CheckpointError: The object is not a readable torch checkpoint.
        """
        return self.checkpoint.load(self.uri(object_name), **torch_load_kwargs)

    def reader(self, object_name: str) -> CheckpointReader:
        """A seekable binary file over the object, to ``torch.load`` from.

        Raises:
            NotFoundError: No such object (also a ``FileNotFoundError``).
        """
        return self.checkpoint.reader(self.uri(object_name))
