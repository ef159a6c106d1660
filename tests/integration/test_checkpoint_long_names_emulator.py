"""A multipart checkpoint save to a name at GCS's 1,024-byte limit, over HTTP.

The save stages its upload under a longer hidden name; the emulator refuses
names over 1,024 bytes as GCS does, so the staging name must fit for every
checkpoint name GCS takes, and ``torchbucket cleanup`` must still find it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from bucket_kinds import stored_names
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.cli import main
from torchbucket.compose.registry import unregister
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

MULTIPART = CheckpointConfig(part_size=64 * 1024, min_part_size=1, upload_method="multipart")
STATE = {"w": torch.arange(40_000, dtype=torch.float32)}  # 160 KB: three parts

NAMES = {
    "1,024 bytes": "run/" + "c" * 1017 + ".pt",
    "1,024 bytes of UTF-8": "run/" + "é" * 508 + "x.pt",
    "a 1,000-byte directory": "d" * 1000 + "/" + "e" * 20 + ".pt",
}


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="long")


@pytest.mark.parametrize("name", NAMES.values(), ids=list(NAMES))
def test_a_multipart_save_to_a_name_at_the_limit(
    emulator: Emulator, bucket: Any, name: str
) -> None:
    assert len(name.encode()) <= 1024
    uri = f"gs://{bucket.bucket}/{name}"
    checkpoint = BucketCheckpoint(config=MULTIPART, gcs=bucket.config)
    checkpoint.save(STATE, uri)
    assert stored_names(emulator, bucket.bucket) == [name]  # nothing staged is left
    assert torch.equal(checkpoint.load(uri, weights_only=True)["w"], STATE["w"])


def test_cleanup_finds_what_a_save_to_a_name_at_the_limit_leaves(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = NAMES["1,024 bytes"]
    checkpoint = BucketCheckpoint(config=MULTIPART, gcs=bucket.config)
    emulator.add_fault("delete", "403", match=".tbtmp-", count=None)  # as a kill would skip it
    checkpoint.save(STATE, f"gs://{bucket.bucket}/{name}")
    emulator.clear_faults()
    left = [n for n in stored_names(emulator, bucket.bucket) if n != name]
    assert len(left) == 1 and len(left[0].encode()) <= 1024, left
    unregister(bucket, left[0])  # a killed process would not delete it at exit

    argv = ["--endpoint", emulator.endpoint, "--deadline", "20", "cleanup"]
    assert main([*argv, f"gs://{bucket.bucket}/run/"]) == 0
    assert f"removing staged checkpoint object gs://{bucket.bucket}/{left[0]}" in (
        capsys.readouterr().out
    )
    assert stored_names(emulator, bucket.bucket) == [name]
