import json
import os

import torch

# from dataflux_pytorch import dataflux_checkpoint
from torchbucket.dataflux import dataflux_checkpoint

PROJECT_NAME = os.environ["PROJECT_NAME"]
BUCKET_NAME = os.environ["BUCKET_NAME"]

ckpt = dataflux_checkpoint.DatafluxCheckpoint(project_name=PROJECT_NAME, bucket_name=BUCKET_NAME)
CKPT_PATH = "checkpoints/epoch0.ckpt"

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

with ckpt.writer(CKPT_PATH) as writer:
    torch.save(model.state_dict(), writer)

with ckpt.reader(CKPT_PATH) as reader:
    read_state_dict = torch.load(reader)

model.load_state_dict(read_state_dict)

print(
    "RESULT "
    + json.dumps(
        {
            "same": all(torch.equal(v, model.state_dict()[k]) for k, v in read_state_dict.items()),
            "sum": float(sum(v.sum() for v in read_state_dict.values())),
        }
    )
)
