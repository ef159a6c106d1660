"""DCP and Lightning on a zonal bucket of the emulator, over gRPC, unchanged for the user.

The same calls as on a regional bucket (``test_dcp_emulator.py``,
``test_lightning_emulator.py``); the store finds the bucket zonal and saves
stream into appendable objects behind pointers (``storage/gcs/_zonal.py``),
which listings, Lightning's directory checks and deletes never show.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]
pytest.importorskip("grpc")

CONFIG = CheckpointConfig(part_size=32 * 1024, min_part_size=1, range_size=16 * 1024)


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture
def zonal(emu: Emulator) -> tuple[str, GCSConfig]:
    assert emu.grpc_endpoint is not None
    name = f"zonal-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=True)
    return name, GCSConfig(endpoint=emu.endpoint, grpc_endpoint=f"http://{emu.grpc_endpoint}")


def _visible(emu: Emulator, bucket: str) -> list[str]:
    return [n for n in emu.object_names(bucket) if not n.startswith("torchbucket-zonal-objects/")]


def test_dcp_save_and_load(emu: Emulator, zonal: tuple[str, GCSConfig]) -> None:
    bucket, gcs = zonal
    uri = f"gs://{bucket}/ckpt"
    g = torch.Generator().manual_seed(1)
    original = {"w": torch.randn(256, 256, generator=g), "b": torch.randn(256), "step": 1}
    emu.reset_stats()
    dcp.save(original, storage_writer=BucketStorageWriter(uri, checkpoint=CONFIG, gcs=gcs))
    target = {"w": torch.zeros(256, 256), "b": torch.zeros(256), "step": -1}
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=CONFIG, gcs=gcs))
    assert torch.equal(target["w"], original["w"]) and target["step"] == 1
    stats = emu.stats()
    assert not {"compose", "copy", "mpu_initiate"} & set(stats["by_op"])
    assert stats["by_rpc"]["BidiWriteObject"] >= 2 and stats["by_rpc"]["BidiReadObject"] >= 1
    assert any(n.endswith(".metadata") for n in _visible(emu, bucket))


def test_lightning_fit_top_k_and_resume(
    emu: Emulator, zonal: tuple[str, GCSConfig], tmp_path: Any, torchbucket_gs: None
) -> None:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from torchbucket.lightning import BucketCheckpointIO

    bucket, gcs = zonal

    class Tiny(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", float(self.current_epoch), on_epoch=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    dirpath = f"gs://{bucket}/run"

    def trainer(epochs: int) -> Any:
        return L.Trainer(
            max_epochs=epochs,
            plugins=[BucketCheckpointIO(checkpoint=CheckpointConfig(), gcs=gcs)],
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

    trainer(4).fit(Tiny(), data, data)
    assert _visible(emu, bucket) == [
        "run/epoch=0-step=2.ckpt",
        "run/epoch=1-step=4.ckpt",
        "run/last.ckpt",
    ]
    model = Tiny()
    resumed = trainer(5)
    resumed.fit(model, data, data, ckpt_path=f"{dirpath}/last.ckpt")
    assert resumed.global_step == 10
    last = BucketCheckpoint(gcs=gcs).load(f"{dirpath}/last.ckpt", weights_only=True)
    assert torch.equal(last["state_dict"]["layer.weight"], model.layer.weight.detach())
