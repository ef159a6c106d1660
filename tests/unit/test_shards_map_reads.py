"""``BucketShardMapDataset``'s batched reads: merged byte ranges, every sample served.

A batch's samples of one shard are read with one GET per run of nearby
samples (``storage.ranges.merge_ranges``); a sample whose members are all
empty needs no read at all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from memory_helper import memory_bucket

from torchbucket.runtime import accounting
from torchbucket.shards import BucketShardMapDataset, PackConfig, pack

SIZES = [0, 3, 0, 5000, 0, 7, 300_000, 0]  # empty members among others, one far apart


@pytest.fixture
def dataset() -> Iterator[BucketShardMapDataset]:
    objects = [(f"raw/{i:04d}.bin", bytes([i + 1]) * n) for i, n in enumerate(SIZES)]
    with memory_bucket("shmap", objects) as name:
        pack(
            f"memory://{name}/raw/",
            f"memory://{name}/packed/",
            config=PackConfig(shard_size=1 << 20),
            progress=False,
        )
        yield BucketShardMapDataset.from_prefix(f"memory://{name}/packed/")


def _expected(i: int) -> bytes:
    return bytes([i + 1]) * SIZES[i]


def test_every_sample_is_read_alone_and_in_a_batch(dataset: BucketShardMapDataset) -> None:
    assert len(dataset) == len(SIZES)
    for i in range(len(SIZES)):
        assert dataset[i]["bin"] == _expected(i)
    order = [7, 0, 6, 2, 5, 1, 4, 3, 0]
    assert [s["bin"] for s in dataset.__getitems__(order)] == [_expected(i) for i in order]


def test_nearby_samples_share_a_read_and_empty_ones_need_none(
    dataset: BucketShardMapDataset,
) -> None:
    with accounting.measure() as m:
        dataset.__getitems__([0, 1, 2, 3, 4, 5])  # one run of samples, some empty
    assert dict(m.stats.by_op) == {"get": 1}
    with accounting.measure() as m:
        dataset.__getitems__([0, 2])  # empty samples only
    assert dict(m.stats.by_op) == {}
