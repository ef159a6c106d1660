"""DCP across 2 torchrun ranks (gloo) into the emulator: save, async_save, load, reshard."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from _torchrun import torchrun

from bucket_kinds import stored_names
from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dcp import BucketStorageReader
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.torchrun,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

WORKER = Path(__file__).with_name("_dcp_worker.py")


def run_ranks(mode: str, emulator: Emulator, uri: str, out: Path) -> list[dict[str, Any]]:
    return torchrun(WORKER, mode, emulator.endpoint, uri, str(out), out=out)


def full_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)  # as in _dcp_worker.full_state
    return {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g)}


@pytest.mark.parametrize("mode", ["save", "async"])
def test_two_ranks_save_and_load_then_one_rank_reshards(
    emulator: Emulator, tmp_path: Path, mode: str
) -> None:
    bucket = f"dcp-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(bucket)
    uri = f"gs://{bucket}/ckpt/step-7"
    ranks = run_ranks(mode, emulator, uri, tmp_path)
    for report in ranks:
        assert report["local_shard_ok"] and report["full_ok"] and report["b_ok"], report
        assert report["step"] == 7
    names = stored_names(emulator, bucket)
    assert len(names) == 3 and names[0] == "ckpt/step-7/.metadata"
    # One data file per rank, named for its save.
    assert re.fullmatch(r"ckpt/step-7/__0_0\.\w+\.distcp", names[1])
    assert re.fullmatch(r"ckpt/step-7/__1_0\.\w+\.distcp", names[2])

    # One process loads the 2-rank checkpoint into whole tensors.
    full = full_state()
    target: dict[str, Any] = {
        "model": {"w": torch.zeros_like(full["w"]), "b": torch.zeros_like(full["b"])},
        "step": -1,
    }
    config = CheckpointConfig(range_size=16 * 1024)
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True)
    reader = BucketStorageReader(uri, checkpoint=config, gcs=gcs)
    dcp.load(target, storage_reader=reader)
    assert torch.equal(target["model"]["w"], full["w"])
    assert torch.equal(target["model"]["b"], full["b"])
    assert target["step"] == 7
    # Each rank fetched about its own half of the data, not every file.
    assert all(report["bytes_fetched"] < 0.75 * reader.bytes_fetched for report in ranks), (
        ranks,
        reader.bytes_fetched,
    )
