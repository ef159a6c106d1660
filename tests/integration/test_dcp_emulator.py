"""DCP in one process against the emulator over HTTP."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from bucket_kinds import stored_names
from torchbucket import runtime
from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
from torchbucket.emulator import Emulator
from torchbucket.errors import CheckpointError

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

CONFIG = CheckpointConfig(part_size=32 * 1024, min_part_size=1, range_size=16 * 1024)


def state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(128, 128, generator=g),
        "b": torch.randn(128, generator=g),
        "step": seed,
    }


def zeros() -> dict[str, Any]:
    return {"w": torch.zeros(128, 128), "b": torch.zeros(128), "step": -1}


def test_save_load_and_local_copy(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], tmp_path: Path
) -> None:
    store = gcs_bucket_factory(emulator, prefix="dcp")
    uri = f"gs://{store.bucket}/ckpt"
    original = state(1)
    dcp.save(original, storage_writer=BucketStorageWriter(uri, checkpoint=CONFIG, gcs=store.config))
    target = zeros()
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=CONFIG, gcs=store.config))
    assert torch.equal(target["w"], original["w"]) and target["step"] == 1

    # Copied to a folder, the same files load with torch's own reader.
    for name in stored_names(emulator, store.bucket, "ckpt/"):
        local = tmp_path / name.removeprefix("ckpt/")
        local.write_bytes(runtime.run(store.get(name)))
    target = zeros()
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(tmp_path)))
    assert torch.equal(target["b"], original["b"]) and target["step"] == 1


def test_interrupted_save_is_not_loadable(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], bucket_kind: str
) -> None:
    store = gcs_bucket_factory(emulator, prefix="dcp")
    uri = f"gs://{store.bucket}/ckpt"
    # The data file goes up (a multipart upload), then the metadata write (the
    # only single-request upload here; the emulator cannot match its name, which
    # travels in the request body) is refused: the save fails. On a zonal
    # bucket every write is a gRPC "put" whose name the emulator sees: the
    # metadata's is refused.
    match = ".metadata" if bucket_kind == "zonal" else None
    emulator.add_fault("put", "403", count=None, match=match)
    with pytest.raises(CheckpointException):
        dcp.save(
            state(2),
            storage_writer=BucketStorageWriter(uri, checkpoint=CONFIG, gcs=store.config),
        )
    emulator.clear_faults()
    (left,) = stored_names(emulator, store.bucket)  # the data file, named for its save
    assert re.fullmatch(r"ckpt/__0_0\.\w+\.distcp", left)
    with pytest.raises(CheckpointException, match="did not finish"):
        dcp.load(zeros(), storage_reader=BucketStorageReader(uri, gcs=store.config))


class RunsCommand:
    """Pickles as ``os.system(command)``: unpickling it runs the command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def test_metadata_that_would_run_code_is_refused(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], tmp_path: Path
) -> None:
    store = gcs_bucket_factory(emulator, prefix="dcp")
    marker = tmp_path / "ran"
    emulator.seed(
        store.bucket, {"run/step1/.metadata": pickle.dumps(RunsCommand(f"touch {marker}"))}
    )
    uri = f"gs://{store.bucket}/run/step1"
    with pytest.raises(CheckpointException, match=r"refused to load posix\.system") as caught:
        dcp.load(zeros(), storage_reader=BucketStorageReader(uri, gcs=store.config))
    # torch reports both metadata reads it tried: both say why.
    assert f"{uri}/.metadata" in str(caught.value) and "does not exist" not in str(caught.value)
    with pytest.raises(CheckpointError, match=r"refused to load posix\.system"):
        BucketStorageReader(uri, gcs=store.config).read_metadata()
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["random", "truncated"])
def test_corrupt_metadata_is_called_corrupt(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], damage: str
) -> None:
    store = gcs_bucket_factory(emulator, prefix="dcp")
    uri = f"gs://{store.bucket}/ckpt"
    dcp.save(state(3), storage_writer=BucketStorageWriter(uri, checkpoint=CONFIG, gcs=store.config))
    whole = runtime.run(store.get("ckpt/.metadata"))
    bad = os.urandom(len(whole)) if damage == "random" else whole[: len(whole) - 7]
    emulator.seed(store.bucket, {"ckpt/.metadata": bad})
    with pytest.raises(CheckpointException, match="not DCP metadata, or corrupt") as caught:
        dcp.load(zeros(), storage_reader=BucketStorageReader(uri, gcs=store.config))
    assert f"{uri}/.metadata" in str(caught.value)
    assert "does not exist" not in str(caught.value)
