"""Two ranks under torchrun (gloo): rank 0 lists, rank 1 receives the same listing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _torchrun import torchrun

from torchbucket.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.torchrun]

N = 1234


def test_rank_zero_lists_and_the_others_receive(emulator: Emulator, tmp_path: Path) -> None:
    bucket = f"lt-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(bucket)
    names = [f"data/{i:05d}" for i in range(N)] + ["data/é", "data/~z"]
    emulator.seed(bucket, {name: name.encode() for name in names})
    worker = Path(__file__).with_name("_dist_listing_worker.py")
    rank0, rank1 = torchrun(worker, emulator.endpoint, bucket, str(tmp_path), out=tmp_path)
    # The same sorted listing, down to sizes and generations, on both ranks.
    assert rank0["names"] == sorted(names, key=lambda n: n.encode())
    assert rank1["names"] == rank0["names"] and rank1["infos"] == rank0["infos"]
    # Listed once: rank 0 made the requests, rank 1 none.
    assert rank0["calls"] >= N // 100 and rank1["calls"] == 0
    # A failure on rank 0 fails every rank, with the same error, instead of a hang.
    uri = f"gs://{bucket}/data/"
    assert rank0["error"] == rank1["error"] == ["PermissionDeniedError", uri]
    assert rank1["calls_failing"] == 0
    # broadcast=False: each rank lists for itself.
    assert rank0["alone"] == rank1["alone"] == len(names)
    assert rank1["calls_alone"] > 0
