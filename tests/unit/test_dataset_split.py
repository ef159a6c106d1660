"""``split`` and ``subset``: parts of a dataset's listing that read ahead.

``random_split`` wraps a dataset in torch ``Subset``s, which hide torch's
sampler from it (a DataLoader over one reads a batch at a time). These check,
on the memory store, that ``ds.split`` draws exactly ``random_split``'s parts,
that each part is a dataset of its own that a plain DataLoader reads ahead
(compose runs only when reading ahead), that the iterable dataset's parts keep
its order settings, and that wrong lengths or indices are named.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from memory_helper import memory_bucket
from torch.utils.data import DataLoader, random_split

from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig
from torchbucket.errors import ConfigError

N = 250
BATCH = 16


def payload(i: int) -> bytes:
    return f"split-{i:05d}|".encode() * (1 + i % 3)


def _as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("split", ((f"train/{i:05d}", payload(i)) for i in range(N))) as name:
        yield name


def _dataset(bucket: str, **kwargs: Any) -> BucketMapDataset:
    return BucketMapDataset.from_prefix(f"memory://{bucket}/train/", **kwargs)


@pytest.mark.parametrize("lengths", [[0.8, 0.2], [0.7, 0.2, 0.1], [200, 50], [0.34, 0.33, 0.33]])
def test_split_draws_random_splits_parts(bucket: str, lengths: list[float]) -> None:
    ds = _dataset(bucket)
    parts = ds.split(lengths, generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random_split's own advice, checked below
        ref = random_split(ds, lengths, generator=torch.Generator().manual_seed(3))
    assert [len(p) for p in parts] == [len(r) for r in ref]
    for part, subset in zip(parts, ref, strict=True):
        assert isinstance(part, BucketMapDataset)
        assert [part.uri(k) for k in range(len(part))] == [ds.uri(i) for i in subset.indices]
        assert [part[k] for k in range(len(part))] == [payload(i) for i in subset.indices]


def test_split_without_a_generator_draws_from_torchs_global_one(bucket: str) -> None:
    ds = _dataset(bucket)
    torch.manual_seed(11)
    parts = ds.split([0.5, 0.5])
    after = torch.rand(2)
    torch.manual_seed(11)
    ref = random_split(range(N), [0.5, 0.5])
    assert torch.equal(torch.rand(2), after)
    assert [part.uri(0) for part in parts] == [ds.uri(r.indices[0]) for r in ref]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_reads_a_part_ahead(bucket: str, workers: int) -> None:
    ds = _dataset(bucket)
    train, val = ds.split([0.8, 0.2], generator=torch.Generator().manual_seed(0))
    loader = DataLoader(
        train,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        collate_fn=_as_list,
    )
    torch.manual_seed(5)
    got = [list(batch) for batch in loader]
    # Composed groups: read ahead (batch at a time, compose is off).
    assert train.last_epoch_stats.by_op.get("compose", 0) > 0
    torch.manual_seed(5)
    order = [
        int(i) for b in DataLoader(range(len(train)), batch_size=BATCH, shuffle=True) for i in b
    ]
    assert [s for b in got for s in b] == [train[k] for k in order]
    # The parts share no object, and hold them all.
    names = [p.uri(k) for p in (train, val) for k in range(len(p))]
    assert sorted(names) == sorted(ds.uri(i) for i in range(N))


def test_random_split_is_read_a_batch_at_a_time_and_says_so(bucket: str) -> None:
    ds = _dataset(bucket)
    with pytest.warns(UserWarning, match=r"ds\.split\(lengths") as caught:
        train, _ = random_split(ds, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    assert caught[0].filename == __file__  # points at the caller's random_split line
    got = [
        s for b in DataLoader(train, batch_size=BATCH, shuffle=True, collate_fn=_as_list) for s in b
    ]
    assert sorted(got) == sorted(payload(i) for i in train.indices)
    assert ds.last_epoch_stats.by_op.get("compose", 0) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.split([0.8, 0.2])  # no advice for the way it gives


def test_a_part_keeps_the_datasets_format_and_configs(bucket: str) -> None:
    fetch = FetchConfig(reads_in_flight=8)
    compose = ComposeConfig(enabled=False)
    ds = _dataset(bucket, data_format_fn=len, fetch=fetch, compose=compose)
    part = ds.subset([4, 2, 2])
    assert [part[k] for k in range(3)] == [len(payload(4)), len(payload(2)), len(payload(2))]
    assert part._fetch is fetch and part._compose is compose and part._ahead_compose is compose
    # The defaults stay defaults: compose batch at a time off, on reading ahead.
    plain = _dataset(bucket).subset(range(10))
    assert not plain._compose.enabled and plain._ahead_compose.enabled
    clone = pickle.loads(pickle.dumps(part))
    assert [clone[k] for k in range(3)] == [part[k] for k in range(3)]


def test_iterable_parts_keep_the_order_settings(bucket: str) -> None:
    ds = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/", shuffle=True, seed=9)
    train, val = ds.split([200, 50], generator=torch.Generator().manual_seed(1))
    ref = random_split(range(N), [200, 50], generator=torch.Generator().manual_seed(1))
    assert sorted(train) == sorted(payload(i) for i in ref[0].indices)
    assert sorted(val) == sorted(payload(i) for i in ref[1].indices)
    # Shuffled with the same seed: the same order as a dataset of those objects.
    names = [f"memory://{bucket}/train/{i:05d}" for i in ref[1].indices]
    again = BucketIterableDataset.from_objects(names, shuffle=True, seed=9)
    assert list(val) == list(again)
    assert list(ds.subset([7, 3])) in ([payload(7), payload(3)], [payload(3), payload(7)])


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        ([100, 100], "do not cut a dataset of 250 objects"),
        ([0.5, 0.6], "do not cut"),
        ([250, 0], "leave part 1 of a dataset of 250 objects empty"),
        ("0.5", "a sequence of counts or fractions"),
    ],
)
def test_wrong_lengths_are_named(bucket: str, lengths: Any, match: str) -> None:
    for ds in (_dataset(bucket), BucketIterableDataset.from_prefix(f"memory://{bucket}/train/")):
        with pytest.raises(ConfigError, match=match) as info:
            ds.split(lengths)
        assert f"{type(ds).__name__}.split" in str(info.value)


def test_wrong_indices_are_named(bucket: str) -> None:
    ds = _dataset(bucket)
    with pytest.raises(IndexError, match=r"BucketMapDataset\.subset: index 250 out of range"):
        ds.subset([0, 250])
    with pytest.raises(IndexError, match="index -1 out of range"):
        ds.subset([-1])
    with pytest.raises(ConfigError, match="indices is empty"):
        ds.subset([])
    with pytest.raises(ConfigError, match="must be integers"):
        ds.subset([1.5])
