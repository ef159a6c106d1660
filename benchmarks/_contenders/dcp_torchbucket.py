"""DCP contender: torchbucket's ``BucketStorageWriter`` / ``BucketStorageReader`` on 2 ranks."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import main_dcp


class Storage:
    """torchbucket's DCP storage (defaults: one file per rank, parallel parts)."""

    @staticmethod
    def location(args: SimpleNamespace) -> str:
        return f"gs://{args.bucket}/{args.name}"

    @staticmethod
    def prepare(args: SimpleNamespace) -> Any:
        from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
        from torchbucket.storage.gcs import GCSConfig

        config = CheckpointConfig(**getattr(args, "tb_config", None) or {})
        checkpoint = BucketCheckpoint(config=config, gcs=GCSConfig(endpoint=args.endpoint))
        checkpoint.exists(f"gs://{args.bucket}/{args.name}/warm-up")  # opens the store
        return checkpoint

    @staticmethod
    def writer(checkpoint: Any, uri: str) -> Any:
        from torchbucket.dcp import BucketStorageWriter

        return BucketStorageWriter(uri, bucket_checkpoint=checkpoint)

    @staticmethod
    def reader(checkpoint: Any, uri: str) -> Any:
        from torchbucket.dcp import BucketStorageReader

        return BucketStorageReader(uri, bucket_checkpoint=checkpoint)


if __name__ == "__main__":
    main_dcp(Storage())
