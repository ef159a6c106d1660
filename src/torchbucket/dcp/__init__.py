"""``torch.distributed.checkpoint`` storage in a bucket: ``BucketStorageWriter`` / ``BucketStorageReader``.

Example::

    import torch.distributed.checkpoint as dcp
    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter

    dcp.save(state_dict, storage_writer=BucketStorageWriter("gs://bkt/run/step-100"))
    dcp.load(state_dict, storage_reader=BucketStorageReader("gs://bkt/run/step-100"))

Works with ``dcp.async_save`` too. The files are DCP's standard layout (data
files named per save). ``.metadata`` is read without running code from it, and
records what each data file held, so a load never mixes files of two saves.
"""

from __future__ import annotations

try:
    import torch.distributed.checkpoint  # noqa: F401
except ImportError as exc:  # pragma: no cover - torch built without distributed
    raise ImportError("torchbucket.dcp needs a torch build with torch.distributed (DCP)") from exc

from torchbucket.dcp._reader import BucketStorageReader
from torchbucket.dcp._writer import BucketStorageWriter
from torchbucket.storage.ranges import merge_ranges

__all__ = ["BucketStorageReader", "BucketStorageWriter", "merge_ranges"]
