"""Two ranks under torchrun (gloo): the iterable dataset shards over ranks x workers."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

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
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(worker),
            emulator.endpoint,
            bucket,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):
        per_rank = [ranks[r][epoch] for r in range(2)]
        assert sorted(per_rank[0] + per_rank[1]) == names
        assert abs(len(per_rank[0]) - len(per_rank[1])) <= 1
    # A new shuffle in the second epoch, agreed on by both ranks.
    assert ranks[0][0] != ranks[0][1]
