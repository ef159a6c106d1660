import json
import os

import torch
from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

# from dataflux_pytorch.lightning import DatafluxLightningCheckpoint, DatafluxLightningAsyncCheckpoint
from torchbucket.dataflux.lightning import (
    DatafluxLightningAsyncCheckpoint,
    DatafluxLightningCheckpoint,
)

PROJECT_NAME = os.environ["PROJECT_NAME"]
BUCKET_NAME = os.environ["BUCKET_NAME"]

CKPT = f"gcs://{BUCKET_NAME}/checkpoints/ckpt.ckpt"
dataflux_ckpt = DatafluxLightningCheckpoint(project_name=PROJECT_NAME)

torch.manual_seed(0)
dataloader = DataLoader(RandomDataset(32, 16), batch_size=4)
model = BoringModel()
trainer = Trainer(
    plugins=[dataflux_ckpt],
    min_epochs=1,
    max_epochs=1,
    max_steps=3,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(model, dataloader)
trainer.save_checkpoint(CKPT)
loaded = dataflux_ckpt.load_checkpoint(CKPT)

# The async plugin, with ModelCheckpoint writing under a gcs:// dirpath.
async_ckpt = DatafluxLightningAsyncCheckpoint(project_name=PROJECT_NAME)
async_model = BoringModel()
async_trainer = Trainer(
    plugins=[async_ckpt],
    callbacks=[ModelCheckpoint(dirpath=f"gcs://{BUCKET_NAME}/async/", every_n_train_steps=2)],
    max_epochs=1,
    max_steps=4,
    accelerator="cpu",
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
async_trainer.fit(async_model, dataloader)
async_loaded = dataflux_ckpt.load_checkpoint(f"gcs://{BUCKET_NAME}/async/epoch=0-step=4.ckpt")

print(
    "RESULT "
    + json.dumps(
        {
            "global_step": loaded["global_step"],
            "same": all(
                torch.equal(v, model.state_dict()[k]) for k, v in loaded["state_dict"].items()
            ),
            "async_global_step": async_loaded["global_step"],
            "async_same": all(
                torch.equal(v, async_model.state_dict()[k])
                for k, v in async_loaded["state_dict"].items()
            ),
        }
    )
)
