"""One rank of tests/integration/test_dcp_torchrun.py: DCP through torchbucket, gloo.

Usage (under torchrun): _dcp_worker.py MODE ENDPOINT URI OUT_DIR, MODE ``save``
(dcp.save) or ``async`` (dcp.async_save). Either way the rank then loads the
checkpoint back into a sharded state dict and writes ``OUT_DIR/rank{r}.json``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
from torchbucket.storage.gcs import GCSConfig

CONFIG = CheckpointConfig(part_size=16 * 1024, min_part_size=1, range_size=16 * 1024)


def full_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g)}


def main() -> None:
    mode, endpoint, uri, out = sys.argv[1:5]
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full = full_state()
    gcs = GCSConfig(endpoint=endpoint, anonymous=True)

    state: dict[str, Any] = {
        "model": {"w": distribute_tensor(full["w"], mesh, [Shard(0)]), "b": full["b"]},
        "step": 7,
    }
    writer = BucketStorageWriter(uri, checkpoint=CONFIG, gcs=gcs)
    if mode == "save":
        dcp.save(state, storage_writer=writer)
    else:
        dcp.async_save(state, storage_writer=writer).result()
    dist.barrier()

    target: dict[str, Any] = {
        "model": {
            "w": distribute_tensor(torch.zeros_like(full["w"]), mesh, [Shard(0)]),
            "b": torch.zeros_like(full["b"]),
        },
        "step": -1,
    }
    # max_gap=0: at these toy sizes the default 1 MiB would read through the other
    # rank's shard, and the test checks that each rank reads only what it needs.
    reader = BucketStorageReader(uri, checkpoint=CONFIG, gcs=gcs, max_gap=0)
    dcp.load(target, storage_reader=reader)
    w = target["model"]["w"]
    report = {
        "rank": rank,
        "local_shard_ok": torch.equal(w.to_local(), full["w"].chunk(world)[rank]),
        "full_ok": torch.equal(w.full_tensor(), full["w"]),
        "b_ok": torch.equal(target["model"]["b"], full["b"]),
        "step": target["step"],
        "bytes_fetched": reader.bytes_fetched,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
