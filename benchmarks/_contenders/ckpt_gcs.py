"""Checkpoint contender: plain google-cloud-storage (``upload_from_file`` / ``download_as_bytes``)."""

from __future__ import annotations

import io
import os
import sys
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import gcs_client, main_single


def prepare(args: SimpleNamespace) -> Any:
    bucket = gcs_client(args.endpoint).bucket(args.bucket)
    bucket.blob(f"{args.name}.warm-up").exists()  # opens a connection
    return bucket


def save(bucket: Any, args: SimpleNamespace, state_dict: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    bucket.blob(args.name).upload_from_file(buffer)


def load(bucket: Any, args: SimpleNamespace) -> dict[str, Any]:
    data = bucket.blob(args.name).download_as_bytes()
    return torch.load(io.BytesIO(data), weights_only=True)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main_single(prepare, save, load)
