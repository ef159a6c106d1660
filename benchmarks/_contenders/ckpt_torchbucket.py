"""Checkpoint contender: torchbucket's ``BucketCheckpoint.save`` and ``.load``.

A save is ``torch.save`` into ``BucketCheckpoint.writer``, without torch's zip
CRC32 (``CheckpointConfig.torch_zip_crc32``; the CRC32C of every byte guards
the object; the state dict's tensors uploaded straight out of their memory).
A load is ``BucketCheckpoint.load(uri, weights_only=True)``: the download into
anonymous pages that torch's zip loader slices the tensors out of (no copy of
their bytes), as the docs recommend.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import main_single

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.storage.gcs import GCSConfig


def prepare(args: SimpleNamespace) -> BucketCheckpoint:
    config = CheckpointConfig(**getattr(args, "tb_config", None) or {})
    checkpoint = BucketCheckpoint(config=config, gcs=GCSConfig(endpoint=args.endpoint))
    checkpoint.exists(f"gs://{args.bucket}/{args.name}.warm-up")  # opens the store
    return checkpoint


def save(ckpt: BucketCheckpoint, args: SimpleNamespace, state_dict: dict[str, Any]) -> None:
    ckpt.save(state_dict, f"gs://{args.bucket}/{args.name}")


def load(ckpt: BucketCheckpoint, args: SimpleNamespace) -> dict[str, Any]:
    return ckpt.load(f"gs://{args.bucket}/{args.name}", weights_only=True)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main_single(prepare, save, load)
