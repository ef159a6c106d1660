"""One epoch of each dataset on a zonal bucket through fork workers, in a fresh process.

Run by ``test_zonal_emulator.py`` as ``python _zonal_loader.py ENDPOINT GRPC BUCKET N``:
a process that has not used gRPC before its DataLoader forks (a test process
that has cannot stand for a training script's main process). Exits 0 when
every sample came back once and byte for byte.
"""

from __future__ import annotations

import logging
import random
import sys

from torch.utils.data import DataLoader

from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset
from torchbucket.storage.gcs import GCSConfig


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(1000 + 37 * i)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    endpoint, grpc_endpoint, bucket, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    gcs = GCSConfig(endpoint=endpoint, grpc_endpoint=f"http://{grpc_endpoint}")
    compose = ComposeConfig(allow_with_soft_delete=True)  # asked for; a zonal bucket has none
    want = sorted(payload(i) for i in range(n))
    for cls in (BucketMapDataset, BucketIterableDataset):
        ds = cls.from_prefix(f"gs://{bucket}/raw/", gcs=gcs, compose=compose)
        loader = DataLoader(
            ds,  # type: ignore[arg-type]
            batch_size=16,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=lambda b: [bytes(x) for x in b],
        )
        got = sorted(x for batch in loader for x in batch)
        if got != want:
            print(f"{cls.__name__}: {len(got)} samples, {sum(g in want for g in got)} right")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
