"""BucketMapDataset on the memory store."""

from __future__ import annotations

import pickle
import re
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from memory_helper import memory_bucket
from torch.utils.data import DataLoader, DistributedSampler

from torchbucket import runtime
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig
from torchbucket.datasets import BucketMapDataset
from torchbucket.datasets.catalog import Catalog
from torchbucket.errors import ConfigError, InvalidURIError, NotFoundError
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.memory import MemoryStore

N = 120


def payload(i: int) -> bytes:
    return f"object-{i:04d}|".encode() * (1 + i % 7)


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket(
        "map",
        [
            *((f"train/{i:04d}.bin", payload(i)) for i in range(N)),
            ("other/x.bin", b"not in the prefix"),
        ],
    ) as name:
        yield name


class GetCounter(MemoryStore):
    gets = 0

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, generation: int | None = None
    ) -> bytes:
        type(self).gets += 1
        return await super().get(key, start=start, end=end, generation=generation)


def _composites(bucket: str) -> list[ObjectInfo]:
    return runtime.run(MemoryStore(bucket).list_page(COMPOSITE_PREFIX)).objects


def test_from_prefix_lists_in_name_order_and_reads_by_index(bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(f"memory://{bucket}/train/")
    assert len(ds) == N
    assert ds[0] == payload(0)
    assert ds[-1] == payload(N - 1)
    assert ds.uri(5) == f"memory://{bucket}/train/0005.bin"
    with pytest.raises(IndexError):
        ds[N]


def test_getitems_fetches_a_batch_in_order_composing_small_objects(bucket: str) -> None:
    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    store = GetCounter(bucket)
    ds = BucketMapDataset(Catalog([store], [0] * len(infos), infos), compose=ComposeConfig())
    GetCounter.gets = 0
    indices = [7, 3, 99, 0, 64, 65, 66, 1]
    assert ds.__getitems__(indices) == [payload(i) for i in indices]
    assert GetCounter.gets == 1  # one composite for the whole batch
    assert _composites(bucket) == []

    GetCounter.gets = 0
    plain = BucketMapDataset(Catalog([store], [0] * len(infos), infos))  # off by default
    assert plain.__getitems__(indices) == [payload(i) for i in indices]
    assert GetCounter.gets == len(indices)
    assert not plain._compose.enabled


def test_dataloader_batches_with_data_format_fn(bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(
        f"memory://{bucket}/train/", data_format_fn=lambda b: torch.tensor(len(b))
    )
    loader = DataLoader(ds, batch_size=16, shuffle=True)
    sizes = torch.cat(list(loader)).tolist()
    assert sorted(sizes) == sorted(len(payload(i)) for i in range(N))


def test_distributed_sampler_ranks_cover_the_dataset(bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(f"memory://{bucket}/train/")
    seen: list[bytes] = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=1)
        for batch in DataLoader(ds, batch_size=10, sampler=sampler):
            seen.extend(batch)
    assert sorted(seen) == sorted(payload(i) for i in range(N))


def test_empty_prefix_is_not_found_naming_the_uri(bucket: str) -> None:
    uri = f"memory://{bucket}/nothing-here/"
    with pytest.raises(NotFoundError, match=re.escape(uri)):
        BucketMapDataset.from_prefix(uri)
    with pytest.raises(InvalidURIError):
        BucketMapDataset.from_prefix("s3://bucket/x")


def test_an_empty_prefix_says_why_a_first_run_may_have_missed(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bucket path without gs:// is a local folder relative to the working directory.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotFoundError, match="has no scheme") as caught:
        BucketMapDataset.from_prefix("my-bucket/train/")
    assert "gs://my-bucket/train/" in str(caught.value)
    # A glob is a prefix like any other: nothing expands it.
    with pytest.raises(NotFoundError, match="wildcards are not expanded"):
        BucketMapDataset.from_prefix(f"memory://{bucket}/train/*.bin")
    # An existing folder that is empty gets no hint: its prefix was read as meant.
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFoundError) as caught:
        BucketMapDataset.from_prefix("empty/")
    assert "scheme" not in str(caught.value) and "wildcards" not in str(caught.value)


def test_from_objects_keeps_order_across_buckets(bucket: str) -> None:
    with memory_bucket("map", [("a", b"from the other bucket")]) as other:
        ds = BucketMapDataset.from_objects(
            [
                f"memory://{bucket}/train/0003.bin",
                f"memory://{other}/a",
                f"memory://{bucket}/train/0001.bin",
            ]
        )
        assert ds.__getitems__([0, 1, 2]) == [payload(3), b"from the other bucket", payload(1)]
        assert ds[1] == b"from the other bucket"
    with pytest.raises(ConfigError):
        BucketMapDataset.from_objects([])
    with pytest.raises(NotFoundError, match="nope"):
        BucketMapDataset.from_objects([f"memory://{bucket}/nope"])


def test_object_rewritten_after_listing_raises_instead_of_new_bytes(bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(f"memory://{bucket}/train/")
    runtime.run(MemoryStore(bucket).put("train/0002.bin", payload(2)))  # same bytes, new generation
    with pytest.raises(NotFoundError, match=r"0002\.bin"):
        ds[2]
    with pytest.raises(NotFoundError, match="since it was listed"):
        ds.__getitems__([0, 1, 2, 3])
    assert _composites(bucket) == []
    assert ds.__getitems__([0, 1, 3]) == [payload(0), payload(1), payload(3)]


def _explode(data: bytes) -> bytes:
    raise KeyError("no label in this sample")


def test_data_format_fn_error_keeps_its_type_and_names_the_uri(bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(f"memory://{bucket}/train/", data_format_fn=_explode)
    with pytest.raises(KeyError) as info:
        ds.__getitems__([4, 5])
    text = "".join(traceback.format_exception(info.value))
    assert f"memory://{bucket}/train/0004.bin" in text


def test_pickles_as_listing_and_config(bucket: str) -> None:
    ds = BucketMapDataset.from_prefix(
        f"memory://{bucket}/train/", compose=ComposeConfig(max_composite_object_size=1000)
    )
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == N
    assert clone.__getitems__([10, 11]) == [payload(10), payload(11)]
    assert clone._compose == ds._compose
