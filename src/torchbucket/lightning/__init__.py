"""PyTorch Lightning integration: checkpoints in a bucket, saved in the foreground or background.

Needs the ``lightning`` extra: ``pip install torchbucket[lightning]``. Importing
this module also lets ``ModelCheckpoint(dirpath="gs://...")`` work without
``gcsfs`` (see :func:`register_filesystem`).
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "torchbucket.lightning needs PyTorch Lightning: pip install torchbucket[lightning]"
    ) from exc

from torchbucket.lightning._checkpoint_io import AsyncBucketCheckpointIO, BucketCheckpointIO
from torchbucket.lightning._filesystem import BucketFileSystem, register_filesystem

__all__ = [
    "AsyncBucketCheckpointIO",
    "BucketCheckpointIO",
    "BucketFileSystem",
    "register_filesystem",
]

register_filesystem()
