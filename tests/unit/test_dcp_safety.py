"""DCP checkpoints safe to load: metadata that runs no code, pinned data files, clear errors.

Memory store, one process (the emulator's HTTP path is in
tests/integration/test_dcp_emulator.py and the fault matrix).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from memory_helper import memory_bucket
from torch.distributed.checkpoint.api import CheckpointException

from torchbucket import runtime
from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
from torchbucket.errors import CheckpointError, PreconditionFailedError
from torchbucket.storage import MemoryStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

SMALL = CheckpointConfig(part_size=32 * 1024, min_part_size=1, range_size=16 * 1024)


class RunsCommand:
    """Pickles as ``os.system(command)``: unpickling it runs the command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("dcps") as name:
        yield name


def names(bucket: str, prefix: str) -> list[str]:
    page = runtime.run(MemoryStore(bucket).list_page(prefix))
    return [o.name[len(prefix) :] for o in page.objects]


def tensors(value: float, n: int = 8) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.full((64,), value) for i in range(n)}


def first_failure(info: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    error, _ = next(iter(info.value.failures.values()))  # (error, traceback) by rank
    return error


# -- 1. the metadata runs no code ---------------------------------------------


@pytest.mark.parametrize("where", ["whole", "inside"])
def test_metadata_that_would_run_code_is_refused(bucket: str, tmp_path: Path, where: str) -> None:
    marker = tmp_path / "ran"
    payload: Any = RunsCommand(f"touch {marker}")
    if where == "inside":  # hidden in an otherwise genuine checkpoint's metadata
        dcp.save(tensors(1.0), storage_writer=BucketStorageWriter(f"memory://{bucket}/run/step1"))
        metadata = BucketStorageReader(f"memory://{bucket}/run/step1").read_metadata()
        metadata.planner_data = {"t0": payload}
        payload = metadata
    runtime.run(MemoryStore(bucket).put("run/step1/.metadata", pickle.dumps(payload)))
    uri = f"memory://{bucket}/run/step1"
    with pytest.raises(CheckpointError, match=r"refused to load posix\.system") as info:
        BucketStorageReader(uri).read_metadata()
    assert f"{uri}/.metadata" in str(info.value)
    with pytest.raises(CheckpointException, match=r"refused to load posix\.system") as caught:
        dcp.load(tensors(0.0), storage_reader=BucketStorageReader(uri))
    assert "does not exist" not in str(caught.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    "name",
    [
        "builtins.eval",
        "builtins.getattr",
        "subprocess.Popen",
        "torch.load",
        "torch.serialization.load",
        "torch.distributed.checkpoint.metadata.torch",
        "collections.namedtuple",
    ],
)
def test_no_other_global_is_resolved(bucket: str, name: str) -> None:
    module, _, attr = name.rpartition(".")
    # A pickle that only names the global (GLOBAL, STOP): resolving it is the step refused.
    data = f"c{module}\n{attr}\n.".encode()
    runtime.run(MemoryStore(bucket).put("ckpt/.metadata", data))
    with pytest.raises(CheckpointError, match=f"refused to load {re.escape(name)}:"):
        BucketStorageReader(f"memory://{bucket}/ckpt").read_metadata()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(os.urandom(2000), id="random"),
        pytest.param(b"step: 100\nloss: 0.25\n", id="text"),
        pytest.param(pickle.dumps({"not": "metadata"}), id="other-pickle"),
        pytest.param("truncated", id="truncated"),
    ],
)
def test_corrupt_metadata_says_so(bucket: str, data: bytes | str) -> None:
    uri = f"memory://{bucket}/ckpt"
    dcp.save(tensors(1.0), storage_writer=BucketStorageWriter(uri))
    store = MemoryStore(bucket)
    if data == "truncated":
        whole = runtime.run(store.get("ckpt/.metadata"))
        data = whole[: len(whole) // 2]
    assert isinstance(data, bytes)
    runtime.run(store.put("ckpt/.metadata", data))
    with pytest.raises(CheckpointError, match="not DCP metadata") as info:
        BucketStorageReader(uri).read_metadata()
    assert f"{uri}/.metadata" in str(info.value)
    with pytest.raises(CheckpointException, match="not DCP metadata") as caught:
        dcp.load(tensors(0.0), storage_reader=BucketStorageReader(uri))
    assert "does not exist" not in str(caught.value)
    assert f"{uri}/.metadata" in str(caught.value)


# -- every metadata shape torch's planners produce loads ----------------------


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of world size 1, for DTensor and ShardedTensor."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "pg"), 1), rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def every_shape(seed: int) -> dict[str, Any]:
    from torch.distributed._shard.sharded_tensor import empty as sharded_empty
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    g = torch.Generator().manual_seed(seed)
    mesh = init_device_mesh("cpu", (1,))
    sharded = sharded_empty(ChunkShardingSpec(dim=0, placements=["rank:0/cpu"]), 8, 4)
    sharded.local_shards()[0].tensor.copy_(torch.randn(8, 4, generator=g))
    return {
        "plain": torch.randn(3, 4, generator=g),
        "bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "channels_last": torch.randn(1, 3, 4, 4, generator=g).to(memory_format=torch.channels_last),
        "nested": {"list": [torch.randn(2, generator=g), {"deep": torch.arange(seed, seed + 3)}]},
        "scalars": {"step": seed, "lr": 0.1 * seed, "name": f"run-{seed}", "flag": True},
        "blob": io.BytesIO(f"object-{seed}".encode()),
        "dtensor": distribute_tensor(torch.randn(8, 4, generator=g), mesh, [Shard(0)]),
        "sharded": sharded,
    }


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list):
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif isinstance(want, io.BytesIO):
        assert got.getvalue() == want.getvalue()
    elif hasattr(want, "local_shards"):
        assert torch.equal(got.local_shards()[0].tensor, want.local_shards()[0].tensor)
    elif hasattr(want, "to_local"):
        assert torch.equal(got.to_local(), want.to_local())
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want)
    else:
        assert got == want


@pytest.mark.filterwarnings("ignore:Please use DTensor instead:FutureWarning")
@pytest.mark.parametrize("writer", ["bucket", "torch"])
def test_every_metadata_shape_loads(
    bucket: str, tmp_path: Path, one_rank_group: None, writer: str
) -> None:
    uri = f"memory://{bucket}/shapes"
    original = every_shape(1)
    if writer == "bucket":
        dcp.save(original, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    else:
        folder = tmp_path / "fs"
        dcp.save(original, storage_writer=dcp.FileSystemWriter(str(folder)))
        for path in folder.iterdir():
            runtime.run(MemoryStore(bucket).put(f"shapes/{path.name}", path.read_bytes()))
    # The restricted unpickler reads what plain pickle reads.
    data = runtime.run(MemoryStore(bucket).get("shapes/.metadata"))
    assert BucketStorageReader(uri).read_metadata().state_dict_metadata.keys() == (
        pickle.loads(data).state_dict_metadata.keys()
    )
    target = every_shape(2)
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=SMALL))
    assert_same(target, original)


# -- 2. pinned data files -------------------------------------------------------


def test_a_replaced_data_file_fails_the_load(bucket: str) -> None:
    uri = f"memory://{bucket}/ckpt"
    dcp.save(tensors(1.0), storage_writer=BucketStorageWriter(uri, files_per_rank=2))
    store = MemoryStore(bucket)
    data_file = next(n for n in names(bucket, "ckpt/") if n.startswith("__0_1."))
    flipped = bytearray(runtime.run(store.get(f"ckpt/{data_file}")))
    flipped[-100] ^= 1  # inside a tensor's bytes
    runtime.run(store.put(f"ckpt/{data_file}", bytes(flipped)))
    with pytest.raises(CheckpointException) as caught:
        dcp.load(tensors(0.0), storage_reader=BucketStorageReader(uri))
    error = first_failure(caught)
    assert isinstance(error, CheckpointError), repr(error)
    assert f"{uri}/{data_file}" in str(error) and "replaced or deleted" in str(error)


def test_a_deleted_data_file_fails_the_load(bucket: str) -> None:
    uri = f"memory://{bucket}/ckpt"
    dcp.save(tensors(1.0), storage_writer=BucketStorageWriter(uri))
    data_file = next(n for n in names(bucket, "ckpt/") if n.endswith(".distcp"))
    runtime.run(MemoryStore(bucket).delete(f"ckpt/{data_file}"))
    with pytest.raises(CheckpointException) as caught:
        dcp.load(tensors(0.0), storage_reader=BucketStorageReader(uri))
    error = first_failure(caught)
    assert isinstance(error, CheckpointError) and f"{uri}/{data_file}" in str(error)


def test_a_checkpoint_without_pins_loads_and_says_so(
    bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dcp.save(tensors(3.0), storage_writer=dcp.FileSystemWriter(str(tmp_path)))
    for path in tmp_path.iterdir():
        runtime.run(MemoryStore(bucket).put(f"fs/{path.name}", path.read_bytes()))
    target = tensors(0.0)
    with caplog.at_level(logging.INFO, logger="torchbucket.dcp"):
        dcp.load(target, storage_reader=BucketStorageReader(f"memory://{bucket}/fs"))
    assert all(torch.equal(t, torch.full((64,), 3.0)) for t in target.values())
    lines = [r for r in caplog.records if "cannot be detected" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_a_save_that_finishes_second_fails_and_the_first_stands(bucket: str) -> None:
    uri = f"memory://{bucket}/run/step"
    first = BucketStorageWriter(uri, files_per_rank=4)
    finish = first.finish

    def second_save_meanwhile(metadata: Any, results: Any) -> None:
        # Job B saves whole while job A's data files are written, before A's metadata.
        dcp.save(tensors(2.0), storage_writer=BucketStorageWriter(uri, files_per_rank=4))
        finish(metadata, results)

    first.finish = second_save_meanwhile  # type: ignore[method-assign]
    with pytest.raises(CheckpointException) as caught:
        dcp.save(tensors(1.0), storage_writer=first)
    error = first_failure(caught)
    assert isinstance(error, PreconditionFailedError) and uri in str(error)
    assert "finished first" in str(error)
    target = tensors(0.0)
    dcp.load(target, storage_reader=BucketStorageReader(uri))
    assert all(torch.equal(t, torch.full((64,), 2.0)) for t in target.values())
    # A's data files are gone: only B's four and its metadata remain.
    left = names(bucket, "run/step/")
    assert len(left) == 5 and left[0] == ".metadata"
    assert len({re.sub(r"^__0_\d\.", "", n) for n in left[1:]}) == 1


def test_a_resave_removes_the_replaced_files(bucket: str) -> None:
    uri = f"memory://{bucket}/ckpt"
    dcp.save(tensors(1.0), storage_writer=BucketStorageWriter(uri, files_per_rank=3))
    old = set(names(bucket, "ckpt/")) - {".metadata"}
    dcp.save(tensors(2.0), storage_writer=BucketStorageWriter(uri, files_per_rank=2))
    new = set(names(bucket, "ckpt/")) - {".metadata"}
    assert len(new) == 2 and not new & old
    target = tensors(0.0)
    dcp.load(target, storage_reader=BucketStorageReader(uri))
    assert all(torch.equal(t, torch.full((64,), 2.0)) for t in target.values())
