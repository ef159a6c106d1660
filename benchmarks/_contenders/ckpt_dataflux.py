"""Checkpoint contender: gcs-torch-dataflux's ``DatafluxCheckpoint`` (runs in .venv-bench)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import gcs_client, main_single


def prepare(args: SimpleNamespace) -> Any:
    from dataflux_pytorch.dataflux_checkpoint import DatafluxCheckpoint

    client = gcs_client(args.endpoint)
    client.bucket(args.bucket).blob(f"{args.name}.warm-up").exists()  # opens a connection
    return DatafluxCheckpoint(project_name="test", bucket_name=args.bucket, storage_client=client)


def save(ckpt: Any, args: SimpleNamespace, state_dict: dict[str, Any]) -> None:
    # As dataflux's README: the buffer uploads (XML multipart, 8 threads) on close.
    with ckpt.writer(args.name) as f:
        torch.save(state_dict, f)


def load(ckpt: Any, args: SimpleNamespace) -> dict[str, Any]:
    with ckpt.reader(args.name) as f:
        return torch.load(f, weights_only=True)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main_single(prepare, save, load)
