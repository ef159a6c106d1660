import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import load, save

# from dataflux_pytorch.lightning.gcs_filesystem import GCSDistributedReader, GCSDistributedWriter
from torchbucket.dataflux.lightning.gcs_filesystem import (
    GCSDistributedReader,
    GCSDistributedWriter,
)

PROJECT_NAME = os.environ["PROJECT_NAME"]
BUCKET_NAME = os.environ["BUCKET_NAME"]
OUT = Path(sys.argv[1])

dist.init_process_group("gloo")
rank = dist.get_rank()

torch.manual_seed(0)
model = torch.nn.Linear(16, 8)
state = {"model": model.state_dict(), f"rank{rank}": torch.full((4,), float(rank + 1))}

# As dataflux's multinode demo: a Path, a writer per save, the metadata beside it.
path = Path(f"gcs://{BUCKET_NAME}/dcp/step-1")
writer = GCSDistributedWriter(path, PROJECT_NAME)
save(state, checkpoint_id=path, storage_writer=writer)
if rank == 0:
    with writer.fs.create_stream(path / "extra.pt", "wb") as f:
        torch.save({"epoch": 3}, f)
dist.barrier()

empty = {
    "model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()},
    f"rank{rank}": torch.zeros(4),
}
reader = GCSDistributedReader(path, PROJECT_NAME)
load(empty, checkpoint_id=path, storage_reader=reader)
with reader.fs.create_stream(path / "extra.pt", "rb") as f:
    extra = torch.load(f)

OUT.joinpath(f"rank{rank}.json").write_text(
    json.dumps(
        {
            "model_same": all(torch.equal(v, state["model"][k]) for k, v in empty["model"].items()),
            "own": empty[f"rank{rank}"].tolist(),
            "extra": extra,
        }
    )
)
dist.destroy_process_group()
