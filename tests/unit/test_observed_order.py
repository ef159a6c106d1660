"""A plain DataLoader's sampler observed: the map-style dataset reads ahead in torch's order.

``DataLoader(ds, batch_size=..., shuffle=True)`` builds torch's own samplers;
the dataset takes the order the sampler is about to yield as it sizes the
dataset (``datasets/_observed.py``). These check, on the memory store, that
the batches and the random stream are exactly torch's, that the workers read
ahead (compose runs only when reading ahead: batch at a time it is off), and
that a sampler it does not know is left to the batch-at-a-time path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from memory_helper import memory_bucket
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from torchbucket import runtime
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig
from torchbucket.datasets import BucketBatchSampler, BucketMapDataset, FetchConfig
from torchbucket.datasets._observed import ObservedOrder
from torchbucket.storage.memory import MemoryStore

N = 300
BATCH = 16


def payload(i: int) -> bytes:
    return f"obj-{i:05d}|".encode() * (1 + i % 4)


def _as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("obs", ((f"train/{i:05d}", payload(i)) for i in range(N))) as name:
        yield name


def _dataset(bucket: str, **kwargs: Any) -> BucketMapDataset:
    return BucketMapDataset.from_prefix(f"memory://{bucket}/train/", **kwargs)


def _loader(dataset: Any, workers: int, **kwargs: Any) -> DataLoader[Any]:
    if "batch_sampler" not in kwargs:
        kwargs["batch_size"] = BATCH
    return DataLoader(
        dataset,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        collate_fn=_as_list if isinstance(dataset, BucketMapDataset) else None,
        **kwargs,
    )


def _composites(bucket: str) -> list[str]:
    return [o.name for o in runtime.run(MemoryStore(bucket).list_page(COMPOSITE_PREFIX)).objects]


@pytest.mark.parametrize(
    ("workers", "kwargs"),
    [
        (2, {"shuffle": True}),
        (2, {"shuffle": True, "drop_last": True}),
        (2, {"shuffle": False}),
        (0, {"shuffle": True}),
        (2, {"shuffle": True, "persistent_workers": True}),
        # Batches dealt to whichever worker has room: still torch's batches
        # (read ahead, or on their own where a worker's turn is not the expected one).
        (2, {"shuffle": True, "in_order": False}),
    ],
)
def test_a_plain_dataloader_gets_torchs_batches_read_ahead(
    bucket: str, workers: int, kwargs: dict[str, Any]
) -> None:
    ds = _dataset(bucket)
    for epoch in range(2):
        torch.manual_seed(100 + epoch)
        got = [list(batch) for batch in _loader(ds, workers, **kwargs)]
        after = torch.rand(3)
        # The same seed over a plain range: torch's batches, and torch's
        # global generator left where the DataLoader alone leaves it.
        torch.manual_seed(100 + epoch)
        ref = [[payload(int(i)) for i in batch] for batch in _loader(range(N), workers, **kwargs)]
        assert torch.equal(torch.rand(3), after)
        if kwargs.get("in_order", True):
            assert got == ref
        else:  # the batches may come in another order, each one whole and right
            assert sorted(got) == sorted(ref)
        assert ds._observed.current_epoch == epoch + 1
        # Composed groups: the workers read ahead (batch at a time, compose is off).
        assert ds.last_epoch_stats.by_op.get("compose", 0) > 0
    assert _composites(bucket) == []


def test_a_samplers_own_generator_is_left_as_it_was(bucket: str) -> None:
    ds = _dataset(bucket)
    ref_gen = torch.Generator().manual_seed(5)
    ref = [
        int(i)
        for b in _loader(range(N), 2, sampler=RandomSampler(range(N), generator=ref_gen))
        for i in b
    ]
    gen = torch.Generator().manual_seed(5)
    got = [s for b in _loader(ds, 2, sampler=RandomSampler(ds, generator=gen)) for s in b]
    assert got == [payload(i) for i in ref]
    assert torch.equal(gen.get_state(), ref_gen.get_state())
    assert ds.last_epoch_stats.by_op.get("compose", 0) > 0


def test_distributed_sampler_ranks_read_ahead_their_share(bucket: str) -> None:
    ds = _dataset(bucket)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(2)
        expected = list(sampler)
        got = [s for b in _loader(ds, 2, sampler=sampler) for s in b]
        assert got == [payload(i) for i in expected]
        assert ds.last_epoch_stats.by_op.get("compose", 0) > 0
        seen += got
    assert sorted(set(seen)) == sorted(payload(i) for i in range(N))


class Reversed(RandomSampler):
    """A sampler with an ``__iter__`` of its own: not observed."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source) - 1, -1, -1))


@pytest.mark.parametrize(
    "sampler", [lambda ds: Reversed(ds), lambda ds: RandomSampler(ds, replacement=True)]
)
def test_a_sampler_it_does_not_know_is_read_batch_at_a_time(bucket: str, sampler: Any) -> None:
    ds = _dataset(bucket)
    s = sampler(ds)
    torch.manual_seed(1)
    got = [x for b in _loader(ds, 2, sampler=s) for x in b]
    torch.manual_seed(1)
    ref = [int(i) for b in _loader(range(N), 2, sampler=sampler(range(N))) for i in b]
    assert got == [payload(i) for i in ref]
    assert len(ds._observed.rank_order(0)) == 0  # no order taken
    assert ds.last_epoch_stats.by_op.get("compose", 0) == 0


class EveryKth(BatchSampler):
    """One of ``k`` processes' batches, as Accelerate's ``BatchSamplerShard`` (no split) hands them."""

    def __init__(self, batches: BatchSampler, k: int, r: int) -> None:
        self.batches, self.k, self.r = batches, k, r

    def __iter__(self) -> Iterator[list[int]]:
        return (b for i, b in enumerate(self.batches) if i % self.k == self.r)

    def __len__(self) -> int:
        return len(range(self.r, len(self.batches), self.k))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_process_handed_every_kth_batch_reads_ahead_at_that_step(
    bucket: str, workers: int
) -> None:
    # Torch's sampler inside torch's BatchSampler, wrapped by a sampler that
    # keeps every 3rd batch: the order is observed, and each worker's batches
    # are 3 x W apart in it. After the first window (read at step W), the step
    # is learned from the next batch: no further window is restarted, and
    # nothing beyond that first window is read that is not asked for.
    k = 3
    for r in range(k):
        ds = _dataset(
            bucket, compose=ComposeConfig(enabled=False), fetch=FetchConfig(reads_in_flight=8)
        )

        def loader(data: Any, r: int = r) -> DataLoader[Any]:
            shard = EveryKth(BatchSampler(RandomSampler(data), BATCH, drop_last=False), k, r)
            return _loader(data, workers, batch_sampler=shard)

        torch.manual_seed(20 + r)
        got = [x for b in loader(ds) for x in b]
        torch.manual_seed(20 + r)
        ref = [int(i) for b in loader(range(N)) for i in b]
        assert got == [payload(i) for i in ref]
        wasted = ds.last_epoch_stats.by_op["get"] - len(ref)
        # At most one window's bound per worker: 4 x reads_in_flight ahead,
        # plus the requests in flight.
        assert 0 <= wasted <= max(1, workers) * (4 * 8 + 8)
        if workers == 0:
            reader = ds._reader
            assert reader is not None and reader._step == k and not reader._off


def test_accelerates_seedable_sampler_is_read_ahead_and_keeps_its_epochs(bucket: str) -> None:
    # Hugging Face Trainer's default: Accelerate's RandomSampler subclass seeds
    # its generator from its epoch, delegates to torch's __iter__ and moves the
    # epoch on. Its order is taken past its frame, and its epochs are its own.
    from accelerate.data_loader import SeedableRandomSampler

    ds = _dataset(bucket)
    sampler = SeedableRandomSampler(ds, data_seed=7)
    ref_sampler = SeedableRandomSampler(range(N), data_seed=7)
    for _ in range(2):
        got = [x for b in _loader(ds, 2, sampler=sampler) for x in b]
        ref = [int(i) for b in _loader(range(N), 2, sampler=ref_sampler) for i in b]
        assert got == [payload(i) for i in ref]
        assert ds.last_epoch_stats.by_op.get("compose", 0) > 0  # read ahead
    assert sampler.epoch == ref_sampler.epoch == 2
    assert ds._observed.current_epoch == 2


def test_accelerates_batch_sampler_shard_reads_ahead_at_its_step(bucket: str) -> None:
    # Accelerate across 3 processes: each keeps every 3rd batch of torch's.
    from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler

    seen = []
    for r in range(3):
        ds = _dataset(
            bucket, compose=ComposeConfig(enabled=False), fetch=FetchConfig(reads_in_flight=8)
        )

        def loader(data: Any, r: int = r) -> DataLoader[Any]:
            batches = BatchSampler(SeedableRandomSampler(data, data_seed=3), BATCH, drop_last=False)
            shard = BatchSamplerShard(batches, num_processes=3, process_index=r)
            return _loader(data, 2, batch_sampler=shard)

        got = [x for b in loader(ds) for x in b]
        ref = [int(i) for b in loader(range(N)) for i in b]
        assert got == [payload(i) for i in ref]
        assert ds._observed.current_epoch == 1  # the order taken past both wrappers
        assert 0 <= ds.last_epoch_stats.by_op["get"] - len(ref) <= 2 * (4 * 8 + 8)
        seen += got
    assert set(seen) == {payload(i) for i in range(N)}


def test_len_called_by_anything_else_takes_no_order(bucket: str) -> None:
    ds = _dataset(bucket)
    assert len(ds) == N
    assert ds._observed._order is None  # sized by the user: nothing allocated
    assert len(list(RandomSampler(ds))) == N  # no BatchSampler around it
    assert ds._observed._order is not None  # sized by torch.utils.data: allocated
    assert ds._observed.current_epoch == 0


def test_with_a_bucket_batch_sampler_its_plan_is_followed(bucket: str) -> None:
    ds = _dataset(bucket)
    sampler = BucketBatchSampler(ds, batch_size=BATCH, seed=3)
    got = [
        x
        for b in DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=_as_list)
        for x in b
    ]
    assert got == [payload(i) for b in sampler for i in b]
    assert ds._observed.current_epoch == 0


def test_the_dataflux_compat_dataset_reads_ahead_of_a_plain_dataloader(bucket: str) -> None:
    # Its __len__ calls BucketMapDataset's: the sampler is found past it. Its
    # ``objects`` may be replaced; the order follows the new catalog.
    from torchbucket.dataflux import dataflux_mapstyle_dataset as dms

    ds = dms.DataFluxMapStyleDataset(None, f"memory://{bucket}", dms.Config(prefix="train/"))
    ds.objects = ds.objects[: N // 2]
    torch.manual_seed(4)
    got = [s for b in _loader(ds, 2, shuffle=True) for s in b]
    torch.manual_seed(4)
    ref = [int(i) for b in _loader(range(N // 2), 2, shuffle=True) for i in b]
    assert got == [payload(i) for i in ref]
    assert ds._observed.current_epoch == 1
    # Reading ahead, each worker's window uploads its anchor (a batch read
    # on its own has none, and with dataflux's default config no compose).
    assert ds.last_epoch_stats.by_op.get("put", 0) == 2
    assert _composites(bucket) == []


def test_an_order_not_taken_drops_the_last_epochs_windows(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Persistent workers read ahead in epoch 1's order. If epoch 2's order
    # cannot be taken, they must not keep reading epoch 1's: the version
    # moves on with no order, and they read batch at a time.
    ds = _dataset(bucket)
    loader = _loader(ds, 2, shuffle=True, persistent_workers=True)
    reference = _loader(range(N), 2, shuffle=True, persistent_workers=True)
    torch.manual_seed(8)
    assert sorted(x for b in loader for x in b) == sorted(payload(i) for i in range(N))
    assert ds.last_epoch_stats.by_op.get("compose", 0) > 0
    torch.manual_seed(8)
    list(reference)

    def refuse(sampler: Any) -> Any:
        raise RuntimeError("no order this time")

    monkeypatch.setattr(ObservedOrder, "_run", staticmethod(refuse))
    ds.reset_epoch_stats()
    torch.manual_seed(9)
    got = [list(b) for b in loader]
    torch.manual_seed(9)
    assert got == [[payload(int(i)) for i in b] for b in reference]
    assert ds._observed.current_epoch == 2
    assert ds.last_epoch_stats.by_op.get("compose", 0) == 0
    assert _composites(bucket) == []
