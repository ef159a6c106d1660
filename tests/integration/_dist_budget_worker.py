"""One rank of the budget's rank-death test (launched by test_budget_torchrun.py).

Usage: ``torchrun --nproc_per_node 2 _dist_budget_worker.py ENDPOINT BUCKET OUT_DIR DEAD``.
Both ranks read through a DataLoader (2 workers) with the job-wide budget on;
after a barrier rank DEAD writes what it saw and exits abruptly (``os._exit``:
no atexit, no process group teardown, its share of the job never given back;
rank 0 also publishes the job's rate), and the other reads the whole prefix
again. Each rank writes ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ["TORCHBUCKET_BUDGET"] = json.dumps({"read_rate": 300, "store_timeout": 1.0})

import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from torchbucket.accounting import budget_status
from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketMapDataset
from torchbucket.storage.gcs import GCSConfig


def count(dataset: object) -> int:
    loader = DataLoader(dataset, batch_size=10, num_workers=2, collate_fn=lambda b: b)  # type: ignore[arg-type]
    return sum(len(batch) for batch in loader)


def main() -> None:
    endpoint, bucket, out, dead = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gcs = GCSConfig(endpoint=endpoint, anonymous=True)
    dataset = BucketMapDataset.from_prefix(
        f"gs://{bucket}/data/", gcs=gcs, compose=ComposeConfig(enabled=False)
    )
    first = count(Subset(dataset, range(rank * 100, rank * 100 + 100)))
    time.sleep(1.0)  # a few ticks: the job's counters exchanged
    before = budget_status()[bucket]
    dist.barrier()
    report = {"rank": rank, "first": first, "before": before}
    if rank == dead:
        (out / f"rank{rank}.json").write_text(json.dumps(report))
        os._exit(0)
    start = time.monotonic()
    report["again"] = count(dataset)
    report["again_s"] = time.monotonic() - start
    report["after"] = budget_status()[bucket]
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
