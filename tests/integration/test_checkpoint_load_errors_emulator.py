"""Loading an object that is no readable checkpoint names it, over HTTP.

``torch.load`` of random bytes, text or a truncated checkpoint raises
``EOFError`` (no message), ``KeyError: 101`` or a zip reader's ``RuntimeError``
without the object; ``BucketCheckpoint.load`` raises a ``CheckpointError``
naming the ``gs://`` URI instead, chained from torch's error. A real
checkpoint that torch refuses (a global ``weights_only`` does not allow) keeps
torch's own error.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.emulator import Emulator
from torchbucket.errors import CheckpointError

pytestmark = pytest.mark.emulator


def _saved(**kwargs: Any) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4096, dtype=torch.float32)}, buf, **kwargs)
    return buf.getvalue()


CHECKPOINT = _saved()
LEGACY = _saved(_use_new_zipfile_serialization=False)

UNREADABLE = {
    "random bytes": os.urandom(64 * 1024),
    "text": b"epoch,loss\n1,0.5\n2,0.25\n" * 100,
    "truncated": CHECKPOINT[: len(CHECKPOINT) // 2],
    "truncated legacy": LEGACY[: len(LEGACY) // 2],
    "empty": b"",
}


class NotAllowed:
    """A class ``weights_only`` refuses to rebuild."""


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="bad")


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("data", UNREADABLE.values(), ids=list(UNREADABLE))
def test_an_unreadable_object_raises_an_error_naming_it(
    emulator: Emulator, bucket: Any, data: bytes, mmap: bool
) -> None:
    emulator.seed(bucket.bucket, {"run/step-1.pt": data})
    uri = f"gs://{bucket.bucket}/run/step-1.pt"
    checkpoint = BucketCheckpoint(gcs=bucket.config)
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load(uri, weights_only=True, mmap=mmap)
    assert uri in str(caught.value)
    assert "not a readable torch checkpoint" in str(caught.value)
    assert caught.value.__cause__ is not None  # torch's own error, kept for the traceback


def test_a_checkpoint_torch_refuses_keeps_torchs_error(emulator: Emulator, bucket: Any) -> None:
    buf = io.BytesIO()
    torch.save({"obj": NotAllowed()}, buf)
    emulator.seed(bucket.bucket, {"run/custom.pt": buf.getvalue()})
    checkpoint = BucketCheckpoint(gcs=bucket.config)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        checkpoint.load(f"gs://{bucket.bucket}/run/custom.pt", weights_only=True)


@pytest.mark.parametrize("data", [CHECKPOINT, LEGACY], ids=["zip", "legacy"])
def test_a_whole_checkpoint_still_loads(emulator: Emulator, bucket: Any, data: bytes) -> None:
    emulator.seed(bucket.bucket, {"run/ok.pt": data})
    loaded = BucketCheckpoint(gcs=bucket.config).load(f"gs://{bucket.bucket}/run/ok.pt")
    assert torch.equal(loaded["w"], torch.arange(4096, dtype=torch.float32))
