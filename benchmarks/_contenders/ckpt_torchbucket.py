"""Checkpoint contender: torchbucket's ``BucketCheckpoint`` writer/reader with torch.save/torch.load."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

import torch

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
    with ckpt.writer(f"gs://{args.bucket}/{args.name}") as f:
        torch.save(state_dict, f)


def load(ckpt: BucketCheckpoint, args: SimpleNamespace) -> dict[str, Any]:
    with ckpt.reader(f"gs://{args.bucket}/{args.name}") as f:
        return torch.load(f, weights_only=True)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main_single(prepare, save, load)
