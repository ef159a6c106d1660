"""A DCP checkpoint's non-tensor values (BYTE_IO items) are read without running code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
from torchbucket.emulator import Emulator
from torchbucket.errors import CheckpointError

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

CONFIG = CheckpointConfig(part_size=32 * 1024, min_part_size=1, range_size=16 * 1024)


class _Evil:
    """Pickles as a call that creates a file: what a hostile writer would store."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


@pytest.mark.parametrize(
    "target",
    [
        {"w": torch.zeros(8), "step": -1},
        # Tensors only: the metadata alone makes "step" a BYTE_IO item.
        {"w": torch.zeros(8), "step": torch.zeros(1)},
    ],
    ids=["non-tensor", "tensors-only"],
)
def test_a_hostile_non_tensor_value_runs_no_code(
    emulator: Emulator,
    gcs_bucket_factory: Callable[..., Any],
    tmp_path: Path,
    target: dict[str, Any],
) -> None:
    store = gcs_bucket_factory(emulator, prefix="dcp")
    uri = f"gs://{store.bucket}/ckpt"
    marker = tmp_path / "pwned"
    # Another writer of the bucket saves a checkpoint whose "step" runs code.
    hostile = {"w": torch.ones(8), "step": _Evil(marker)}
    dcp.save(hostile, storage_writer=BucketStorageWriter(uri, checkpoint=CONFIG, gcs=store.config))
    assert not marker.exists()

    with pytest.raises((CheckpointError, CheckpointException)) as caught:
        dcp.load(
            target, storage_reader=BucketStorageReader(uri, checkpoint=CONFIG, gcs=store.config)
        )
    assert not marker.exists(), "loading the checkpoint ran code stored in the bucket"
    assert "weights_only" in str(caught.value) and "'step'" in str(caught.value)


def test_plain_non_tensor_values_still_load(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator, prefix="dcp")
    uri = f"gs://{store.bucket}/ckpt"
    saved = {"w": torch.ones(8), "step": 7, "extra": {"lr": 0.1, "names": ["a", "b"]}}
    dcp.save(saved, storage_writer=BucketStorageWriter(uri, checkpoint=CONFIG, gcs=store.config))
    target: dict[str, Any] = {"w": torch.zeros(8), "step": -1, "extra": {"lr": 0.0, "names": []}}
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=CONFIG, gcs=store.config))
    assert target["step"] == 7 and target["extra"] == {"lr": 0.1, "names": ["a", "b"]}
    assert torch.equal(target["w"], torch.ones(8))
