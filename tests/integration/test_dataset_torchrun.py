"""Two ranks under torchrun (gloo): the iterable dataset shards over ranks x workers."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _torchrun import torchrun

from torchbucket.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.torchrun]

N = 203  # not a multiple of 2 ranks x 2 workers


def test_two_ranks_read_every_object_exactly_once_per_epoch(
    emulator: Emulator, tmp_path: Path
) -> None:
    bucket = f"tr-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(bucket)
    names = [f"object-{i:04d}" for i in range(N)]
    emulator.seed(bucket, {f"train/{name}": name.encode() for name in names})
    worker = Path(__file__).with_name("_dist_dataset_worker.py")
    ranks = torchrun(worker, emulator.endpoint, bucket, str(tmp_path), out=tmp_path)
    for epoch in range(2):
        per_rank = [ranks[r][epoch] for r in range(2)]
        assert sorted(per_rank[0] + per_rank[1]) == names
        assert abs(len(per_rank[0]) - len(per_rank[1])) <= 1
    # A new shuffle in the second epoch, agreed on by both ranks.
    assert ranks[0][0] != ranks[0][1]
