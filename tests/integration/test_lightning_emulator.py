"""A real Lightning Trainer checkpointing into gs:// on the emulator, without gcsfs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from bucket_kinds import stored_names
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.emulator import Emulator
from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO, BucketFileSystem

pytestmark = [
    pytest.mark.emulator,
    # Lightning 2.6 uses a torch.utils._pytree name that torch 2.13 deprecates.
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]

SMALL_PARTS = CheckpointConfig(part_size=16 * 1024, min_part_size=1)


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        # Worse every epoch, so top-k keeps the first epochs.
        self.log("val_loss", float(self.current_epoch), on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader() -> DataLoader[Any]:
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def make_trainer(plugin: Any, dirpath: str, tmp_path: Any, epochs: int) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        plugins=[plugin],
        callbacks=[
            ModelCheckpoint(
                dirpath=dirpath, monitor="val_loss", mode="min", save_top_k=2, save_last=True
            )
        ],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )


@pytest.mark.parametrize("plugin_type", [BucketCheckpointIO, AsyncBucketCheckpointIO])
def test_fit_top_k_and_resume_in_gs(
    emulator: Emulator,
    gcs_bucket_factory: Callable[..., Any],
    tmp_path: Any,
    plugin_type: Any,
    torchbucket_gs: None,
) -> None:
    store = gcs_bucket_factory(emulator, prefix="light")
    dirpath = f"gs://{store.bucket}/run"

    def plugin() -> Any:
        return plugin_type(checkpoint=SMALL_PARTS, gcs=store.config)

    trainer = make_trainer(plugin(), dirpath, tmp_path, epochs=4)
    trainer.fit(TinyModel(), loader(), loader())
    # save_top_k=2 kept epochs 0 and 1; epochs 2 and 3 were saved, then removed.
    assert stored_names(emulator, store.bucket) == [
        "run/epoch=0-step=2.ckpt",
        "run/epoch=1-step=4.ckpt",
        "run/last.ckpt",
    ]
    # Lightning's own directory checks go through torchbucket's fsspec filesystem.
    fs = trainer.checkpoint_callback._fs  # type: ignore[union-attr]
    assert isinstance(fs, BucketFileSystem)
    assert fs.exists(f"{dirpath}/last.ckpt") and not fs.exists(f"{dirpath}/epoch=3-step=8.ckpt")
    assert len(fs.ls(dirpath, detail=False)) == 3
    model = TinyModel()
    resumed = make_trainer(plugin(), dirpath, tmp_path, epochs=5)
    resumed.fit(model, loader(), loader(), ckpt_path=f"{dirpath}/last.ckpt")
    assert resumed.global_step == 10  # 8 restored + 2 trained
    last = BucketCheckpoint(gcs=store.config).load(f"{dirpath}/last.ckpt", weights_only=True)
    assert last["global_step"] == 10
    assert torch.equal(last["state_dict"]["layer.weight"], model.layer.weight.detach())
