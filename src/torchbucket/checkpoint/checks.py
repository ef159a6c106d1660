"""Argument checks for the classes that save through a :class:`BucketCheckpoint`.

The DCP writer and reader and Lightning's ``CheckpointIO`` take a
``CheckpointConfig`` as ``checkpoint=`` (the parameter named after its type,
as ``gcs=`` is) and ``gcs=``, or a ready ``BucketCheckpoint`` as
``bucket_checkpoint=``, which has its own config and gcs: giving it with
either is refused, never one silently ignored.
"""

from __future__ import annotations

from typing import Any

from torchbucket._checks import check_instance
from torchbucket.checkpoint._checkpoint import BucketCheckpoint
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.errors import ConfigError
from torchbucket.storage.checks import check_gcs_config

__all__ = ["check_checkpoint_arguments"]


def check_checkpoint_arguments(
    owner: str, checkpoint: Any, gcs: Any, bucket_checkpoint: Any, *, hint: str = ""
) -> None:
    """Check ``checkpoint=``, ``gcs=`` and ``bucket_checkpoint=`` of ``owner``.

    Raises:
        ConfigError: One is not of its type (``hint`` follows a wrong
            ``checkpoint``), or ``bucket_checkpoint`` came with ``checkpoint``
            or ``gcs``.
    """
    if isinstance(checkpoint, BucketCheckpoint):
        hint = "a BucketCheckpoint goes as bucket_checkpoint="
    check_instance(checkpoint, CheckpointConfig, owner=owner, parameter="checkpoint", hint=hint)
    check_gcs_config(gcs, owner=owner)
    check_instance(bucket_checkpoint, BucketCheckpoint, owner=owner, parameter="bucket_checkpoint")
    if bucket_checkpoint is not None:
        given = [n for n, v in (("checkpoint=", checkpoint), ("gcs=", gcs)) if v is not None]
        if given:
            raise ConfigError(
                f"{owner}: bucket_checkpoint= was given with {' and '.join(given)}; a "
                "BucketCheckpoint has its own config and gcs, so pass one or the other"
            )
