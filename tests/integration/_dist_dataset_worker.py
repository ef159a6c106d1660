"""One rank of the torchrun sharding test (launched by test_dataset_torchrun.py).

Usage: ``torchrun --nproc_per_node 2 _dist_dataset_worker.py ENDPOINT BUCKET OUT_DIR``.
Each rank reads two epochs of a shuffled BucketIterableDataset through a
DataLoader with two workers, taking its rank and world size from the gloo
process group, and writes what it read to ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset
from torchbucket.storage.gcs import GCSConfig


def _as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


def main() -> None:
    endpoint, bucket, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = BucketIterableDataset.from_prefix(
        f"gs://{bucket}/train/",
        gcs=GCSConfig(endpoint=endpoint, anonymous=True, retry=RetryConfig(deadline=30.0)),
        shuffle=True,
        seed=99,
    )
    loader = DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context="fork", collate_fn=_as_list
    )
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        epochs.append([sample.decode() for batch in loader for sample in batch])
    (out_dir / f"rank{rank}.json").write_text(json.dumps(epochs))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
