"""Checkpoints in a bucket: ``torch.save`` through a writer, ``torch.load`` through a reader.

A save uploads parts in parallel while ``torch.save`` is still writing, with
memory bounded by the parts in flight, and the object appears only when it is
complete; an exception aborts it. A load fetches byte ranges in parallel into
one buffer, pinned to one generation of the object.
"""

from __future__ import annotations

from torchbucket.checkpoint._checkpoint import BucketCheckpoint
from torchbucket.checkpoint._cleanup import abort_incomplete_uploads
from torchbucket.checkpoint._reader import CheckpointReader
from torchbucket.checkpoint._writer import CheckpointWriter
from torchbucket.checkpoint.config import CheckpointConfig

__all__ = [
    "BucketCheckpoint",
    "CheckpointConfig",
    "CheckpointReader",
    "CheckpointWriter",
    "abort_incomplete_uploads",
]
