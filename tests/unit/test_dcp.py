"""torch.distributed.checkpoint through BucketStorageWriter/Reader, single process, memory store."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given
from hypothesis import strategies as st
from memory_helper import memory_bucket
from torch.distributed.checkpoint.api import CheckpointException

from torchbucket import runtime
from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter, merge_ranges
from torchbucket.errors import ConfigError, NotFoundError, StorageError
from torchbucket.storage import MemoryStore

# Single-process DCP warns that it assumes a single process: it is meant here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

SMALL = CheckpointConfig(part_size=32 * 1024, min_part_size=1, range_size=16 * 1024)


@pytest.fixture
def bucket() -> Any:
    with memory_bucket("dcp") as name:
        yield name


def model_state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "w1": torch.randn(64, 128, generator=g),
            "b1": torch.randn(128, generator=g),
            "w2": torch.randn(128, 10, generator=g).t(),  # a non-contiguous view
        },
        "step": seed,
        "meta": {"name": f"run-{seed}", "lr": 0.1 * seed},
    }


def empty_like(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "step": -1,
        "meta": {"name": "", "lr": 0.0},
    }


def assert_loaded(loaded: dict[str, Any], original: dict[str, Any]) -> None:
    for name, tensor in original["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name
    assert loaded["step"] == original["step"]
    assert loaded["meta"] == original["meta"]


def object_names(bucket: str, prefix: str = "") -> list[str]:
    page = runtime.run(MemoryStore(bucket).list_page(prefix))
    return [o.name[len(prefix) :] for o in page.objects]


def data_file(bucket: str, prefix: str, rank: int = 0, n: int = 0) -> str:
    """The one data file ``__{rank}_{n}.<save token>.distcp`` under ``prefix``."""
    (name,) = [
        x for x in object_names(bucket, prefix) if re.fullmatch(rf"__{rank}_{n}\.\w+\.distcp", x)
    ]
    return name


@pytest.mark.parametrize("files_per_rank", [1, 3])
def test_save_and_load_round_trip(bucket: str, files_per_rank: int) -> None:
    uri = f"memory://{bucket}/ckpt/step-1"
    original = model_state(1)
    dcp.save(
        original,
        storage_writer=BucketStorageWriter(uri, checkpoint=SMALL, files_per_rank=files_per_rank),
    )
    names = object_names(bucket, "ckpt/step-1/")
    assert names == [".metadata"] + [
        data_file(bucket, "ckpt/step-1/", 0, n) for n in range(files_per_rank)
    ]
    target = empty_like(original)
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=SMALL))
    assert_loaded(target, original)


def test_files_load_with_torchs_own_filesystem_reader(bucket: str, tmp_path: Path) -> None:
    uri = f"memory://{bucket}/ckpt"
    original = model_state(2)
    dcp.save(original, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    store = MemoryStore(bucket)
    for name in object_names(bucket, "ckpt/"):
        (tmp_path / name).write_bytes(runtime.run(store.get(f"ckpt/{name}")))
    target = empty_like(original)
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(tmp_path)))
    assert_loaded(target, original)


def test_checkpoint_without_metadata_is_refused(bucket: str) -> None:
    uri = f"memory://{bucket}/ckpt"
    original = model_state(3)
    dcp.save(original, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    runtime.run(MemoryStore(bucket).delete("ckpt/.metadata"))  # as if the save died before it
    reader = BucketStorageReader(uri)
    with pytest.raises(NotFoundError, match="did not finish") as info:
        reader.read_metadata()
    assert uri in str(info.value)
    # DCP wraps each rank's error in a CheckpointException (a BaseException).
    with pytest.raises(CheckpointException, match="did not finish"):
        dcp.load(empty_like(original), storage_reader=BucketStorageReader(uri))


def test_partial_load_fetches_only_the_needed_ranges(bucket: str) -> None:
    uri = f"memory://{bucket}/ckpt"
    big = {"big": torch.randn(256, 256), "small": torch.arange(10)}
    dcp.save(big, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    file_size = runtime.run(MemoryStore(bucket).head("ckpt/" + data_file(bucket, "ckpt/"))).size
    reader = BucketStorageReader(uri, checkpoint=SMALL, max_gap=0)
    target = {"small": torch.zeros(10, dtype=torch.int64)}
    dcp.load(target, storage_reader=reader)
    assert torch.equal(target["small"], torch.arange(10))
    assert 0 < reader.bytes_fetched < file_size // 10


def test_resave_over_an_old_checkpoint(bucket: str) -> None:
    uri = f"memory://{bucket}/ckpt"
    dcp.save(model_state(4), storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    newer = model_state(5)
    dcp.save(newer, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    target = empty_like(newer)
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=SMALL))
    assert_loaded(target, newer)
    with pytest.raises(CheckpointException, match="overwrite=False") as info:
        dcp.save(newer, storage_writer=BucketStorageWriter(uri, overwrite=False))
    assert isinstance(info.value.failures[0][0], StorageError)


def test_async_save(bucket: str) -> None:
    uri = f"memory://{bucket}/async"
    original = model_state(6)
    future = dcp.async_save(original, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    future.result()
    target = empty_like(original)
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=SMALL))
    assert_loaded(target, original)


def test_checkpoint_ids_are_bucket_uris() -> None:
    assert BucketStorageWriter.validate_checkpoint_id("gs://bkt/ckpt")
    assert BucketStorageReader.validate_checkpoint_id("memory://bkt/ckpt")
    assert not BucketStorageReader.validate_checkpoint_id("/local/dir")


ranges = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 100)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=30,
)


@given(ranges=ranges, gap=st.integers(0, 50))
def test_merge_ranges_covers_each_range_once(ranges: list[tuple[int, int]], gap: int) -> None:
    merged = merge_ranges(ranges, gap)
    assert merged == sorted(merged)
    for (_, end), (start, _) in itertools.pairwise(merged):
        assert start - end > gap  # anything closer would have been merged
    for lo, hi in ranges:
        if hi > lo:
            assert sum(1 for a, b in merged if a <= lo and hi <= b) == 1
    assert all(b > a for a, b in merged)
    covered = sum(b - a for a, b in merged)
    assert covered <= sum(b - a for a, b in ranges) + gap * max(len(ranges) - 1, 0)


def test_merge_ranges_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="before start"):
        merge_ranges([(5, 3)])
    with pytest.raises(ConfigError, match="max_gap"):
        merge_ranges([], max_gap=-1)


def test_save_without_collectives_writes_rank_metadata(bucket: str) -> None:
    uri = f"memory://{bucket}/nc"
    original = model_state(7)
    dcp.save(
        original,
        storage_writer=BucketStorageWriter(uri, checkpoint=SMALL),
        use_collectives=False,
    )
    assert object_names(bucket, "nc/") == ["__0.metadata", data_file(bucket, "nc/")]
    target = empty_like(original)
    # load finds no .metadata and falls back to the rank's own.
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=SMALL))
    assert_loaded(target, original)


def mixed_dtypes() -> dict[str, Any]:
    g = torch.Generator().manual_seed(5)
    return {
        "f32": torch.randn(33, 7, generator=g),
        "bf16": torch.randn(65, generator=g).to(torch.bfloat16),
        "f64": torch.randn(3, 5, generator=g, dtype=torch.float64).t(),
        "i64": torch.randint(-(1 << 40), 1 << 40, (17,), generator=g),
        "u8": torch.randint(0, 255, (13,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(11, generator=g) > 0.5,
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(3.5),
    }


@pytest.mark.parametrize("writer", ["bucket", "torch"])
def test_every_dtype_loads_exactly(bucket: str, tmp_path: Path, writer: str) -> None:
    # Files from torch's own FileSystemWriter place tensors at any byte offset;
    # torchbucket's at aligned ones. Both load bit for bit.
    uri = f"memory://{bucket}/mixed"
    original = mixed_dtypes()
    if writer == "bucket":
        dcp.save(original, storage_writer=BucketStorageWriter(uri, checkpoint=SMALL))
    else:
        dcp.save(original, storage_writer=dcp.FileSystemWriter(str(tmp_path)))
        store = MemoryStore(bucket)
        for path in tmp_path.iterdir():
            runtime.run(store.put(f"mixed/{path.name}", path.read_bytes()))
    target = {k: torch.full_like(v, 1) for k, v in original.items()}
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=SMALL))
    for name, tensor in original.items():
        assert target[name].dtype == tensor.dtype, name
        assert torch.equal(target[name], tensor), name
