"""The job-wide request budget under torchrun (gloo): a rank that dies stalls nobody."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _torchrun import torchrun

from torchbucket.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.torchrun]

N = 400


@pytest.mark.parametrize("dead", [1, 0], ids=["rank1-dies", "rank0-dies"])
def test_a_rank_that_exits_abruptly_leaves_the_others_reading(
    emulator: Emulator, tmp_path: Path, dead: int
) -> None:
    bucket = f"bt-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(bucket)
    emulator.seed(bucket, {f"data/{i:05d}": b"x" * 64 for i in range(N)})
    worker = Path(__file__).with_name("_dist_budget_worker.py")
    ranks = torchrun(worker, emulator.endpoint, bucket, str(tmp_path), str(dead), out=tmp_path)
    alive = ranks[1 - dead]
    # Both ranks spent from one job-wide budget (the store), reads counted.
    assert ranks[0]["first"] == ranks[1]["first"] == 100
    assert ranks[0]["before"]["mode"] == ranks[1]["before"]["mode"] == "job"
    assert alive["before"]["read"]["sent"] >= 100
    # One rank died without a word (rank 0 is also the one that publishes the
    # job's rate); the other read every object again, still on the job's
    # budget (the store lives in torchrun's agent), without waiting on the
    # dead rank: its turn comes from its own cell, never from another rank.
    assert alive["again"] == N
    assert alive["after"]["mode"] == "job"
    assert alive["after"]["read"]["sent"] >= alive["before"]["read"]["sent"] + N
