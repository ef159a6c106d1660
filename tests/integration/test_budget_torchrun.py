"""The job-wide request budget under torchrun (gloo): a rank that dies stalls nobody."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _torchrun import torchrun

from torchbucket.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.torchrun]

N = 400


def test_a_rank_that_exits_abruptly_leaves_the_others_reading(
    emulator: Emulator, tmp_path: Path
) -> None:
    bucket = f"bt-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(bucket)
    emulator.seed(bucket, {f"data/{i:05d}": b"x" * 64 for i in range(N)})
    worker = Path(__file__).with_name("_dist_budget_worker.py")
    rank0, rank1 = torchrun(worker, emulator.endpoint, bucket, str(tmp_path), out=tmp_path)
    # Both ranks spent from one job-wide budget (the store), reads counted.
    assert rank0["first"] == rank1["first"] == 100
    assert rank0["before"]["mode"] == rank1["before"]["mode"] == "job"
    assert rank0["before"]["read"]["sent"] >= 100
    # Rank 1 died without a word; rank 0 read every object again, still on
    # the job's budget (the store lives in torchrun's agent), without waiting
    # on the dead rank: its turn comes from its own cell, never from rank 1.
    assert rank0["again"] == N
    assert rank0["after"]["mode"] == "job"
    assert rank0["after"]["read"]["sent"] >= rank0["before"]["read"]["sent"] + N
