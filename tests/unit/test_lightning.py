"""Lightning CheckpointIO plugins with a real Trainer on CPU, on the memory store."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from memory_helper import memory_bucket
from torch.utils.data import DataLoader, TensorDataset

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.errors import NotFoundError, TransientError
from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO
from torchbucket.storage import MemoryStore

# Lightning 2.6 uses a torch.utils._pytree name that torch 2.13 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

SMALL_PARTS = CheckpointConfig(part_size=16 * 1024, min_part_size=1)


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        # Worse every epoch for the first epochs, so top-k keeps the early ones.
        self.log("val_loss", float(self.current_epoch), on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def trainer(plugin: Any, dirpath: str, tmp_path: Any, epochs: int) -> L.Trainer:
    callback = ModelCheckpoint(
        dirpath=dirpath, monitor="val_loss", mode="min", save_top_k=2, save_last=True
    )
    return L.Trainer(
        max_epochs=epochs,
        plugins=[plugin],
        callbacks=[callback],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )


@pytest.fixture
def bucket() -> Any:
    with memory_bucket("light") as name:
        yield name


def names(bucket: str) -> list[str]:
    page = runtime.run(MemoryStore(bucket).list_page(""))
    return [o.name for o in page.objects]


@pytest.mark.parametrize("plugin_type", [BucketCheckpointIO, AsyncBucketCheckpointIO])
def test_fit_keeps_top_k_and_resumes(bucket: str, tmp_path: Any, plugin_type: Any) -> None:
    dirpath = f"memory://{bucket}/run"
    fit = trainer(plugin_type(checkpoint=SMALL_PARTS), dirpath, tmp_path, epochs=4)
    fit.fit(TinyModel(), loader(), loader())
    # Top-2 by val_loss (0 and 1); epochs 2 and 3 were saved and then removed.
    assert names(bucket) == [
        "run/epoch=0-step=2.ckpt",
        "run/epoch=1-step=4.ckpt",
        "run/last.ckpt",
    ]
    resumed = trainer(plugin_type(checkpoint=SMALL_PARTS), dirpath, tmp_path, epochs=5)
    model = TinyModel()
    resumed.fit(model, loader(), loader(), ckpt_path=f"{dirpath}/last.ckpt")
    assert resumed.global_step == 10  # 8 steps restored, 2 more trained
    last = BucketCheckpoint().load(f"{dirpath}/last.ckpt", weights_only=True)
    assert last["global_step"] == 10
    assert torch.equal(last["state_dict"]["layer.weight"], model.layer.weight.detach())


def test_load_with_map_location_and_weights_only(bucket: str) -> None:
    io = BucketCheckpointIO()
    path = f"memory://{bucket}/x.ckpt"
    io.save_checkpoint({"w": torch.ones(2)}, path)
    loaded = io.load_checkpoint(path, map_location="meta", weights_only=True)
    assert loaded["w"].device.type == "meta"
    io.remove_checkpoint(path)
    io.remove_checkpoint(path)  # already gone: not an error
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(path)


def test_storage_options_are_refused(bucket: str) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        BucketCheckpointIO().save_checkpoint({}, f"memory://{bucket}/x", storage_options={})


def test_async_save_snapshots_tensors_before_returning(bucket: str) -> None:
    io = AsyncBucketCheckpointIO()
    weight = torch.zeros(1000)
    path = f"memory://{bucket}/snap.ckpt"
    io.save_checkpoint({"w": weight}, path)
    weight += 1  # training goes on while the save runs
    io.teardown()
    assert torch.equal(BucketCheckpoint().load(path, weights_only=True)["w"], torch.zeros(1000))


class FailingCheckpoint(BucketCheckpoint):
    def save(self, obj: object, uri: str, **kwargs: Any) -> None:
        raise TransientError("injected", operation="checkpoint save", uri=uri)


def test_async_failure_surfaces_on_next_call_and_teardown(bucket: str) -> None:
    io = AsyncBucketCheckpointIO(bucket_checkpoint=FailingCheckpoint())
    io.save_checkpoint({"w": torch.ones(1)}, f"memory://{bucket}/a.ckpt")
    with pytest.raises(TransientError):
        io.wait()
    io.save_checkpoint({"w": torch.ones(1)}, f"memory://{bucket}/b.ckpt")
    with pytest.raises(TransientError):
        io.teardown()


def test_async_removal_waits_for_the_save_before_it(bucket: str) -> None:
    io = AsyncBucketCheckpointIO(checkpoint=SMALL_PARTS, max_pending=2)
    path = f"memory://{bucket}/gone.ckpt"
    io.save_checkpoint({"w": torch.randn(50_000)}, path)
    io.remove_checkpoint(path)
    io.teardown()
    assert names(bucket) == []
    with pytest.raises(NotFoundError):
        BucketCheckpoint().reader(path)


def test_gs_dirpath_needs_no_gcsfs() -> None:
    # In a fresh process where gcsfs cannot be imported (it is no dependency of
    # ours), importing torchbucket.lightning serves gs:// itself, so that a
    # ModelCheckpoint on gs:// is accepted (plain fsspec would raise ImportError).
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['gcsfs'] = None\n"
        "import importlib.util\n"
        "importlib.util.find_spec = lambda name, *a, _f=importlib.util.find_spec: "
        "None if name == 'gcsfs' else _f(name, *a)\n"
        "import fsspec\n"
        "from lightning.fabric.utilities.cloud_io import get_filesystem\n"
        "from lightning.pytorch.callbacks import ModelCheckpoint\n"
        "from torchbucket.lightning import BucketFileSystem\n"
        "assert fsspec.get_filesystem_class('gs') is BucketFileSystem\n"
        "assert isinstance(get_filesystem('gs://bucket/run/'), BucketFileSystem)\n"
        "ModelCheckpoint(dirpath='gs://bucket/run/')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_an_installed_gcsfs_keeps_gs_unless_forced() -> None:
    import importlib

    import fsspec
    import gcsfs

    from torchbucket.lightning import BucketFileSystem, register_filesystem

    # gcsfs is in the test environment: importing torchbucket.lightning left it
    # in charge of gs://, since other code in the process may rely on it.
    assert not register_filesystem()
    assert fsspec.get_filesystem_class("gs") is gcsfs.GCSFileSystem
    _fsspec_registry = importlib.import_module("fsspec.registry")
    saved = dict(_fsspec_registry._registry)
    try:
        assert register_filesystem(force=True)
        assert fsspec.get_filesystem_class("gs") is BucketFileSystem
        assert fsspec.get_filesystem_class("gcs") is BucketFileSystem
    finally:
        _fsspec_registry._registry.clear()
        _fsspec_registry._registry.update(saved)


def test_missing_lightning_names_the_extra() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['lightning'] = None\n"
        "try:\n    import torchbucket.lightning\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install torchbucket[lightning]" in out.stdout
