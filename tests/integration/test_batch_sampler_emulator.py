"""The map-style fast path over HTTP against the emulator: ``BucketMapDataset`` with
a ``BucketBatchSampler`` through a DataLoader (fork and spawn), reading ahead without
reading anything twice, resumable through ``StatefulDataLoader``."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from bucket_kinds import stored_names
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketBatchSampler, BucketMapDataset, FetchConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig

# The shared resume check lives with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from resume_helper import check_resumable
from wait_helper import wait_for

pytestmark = pytest.mark.emulator

N = 200
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


def payload(i: int) -> bytes:
    return f"gcs-object-{i:05d};".encode() * (1 + i % 11)


def _as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"bs-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"train/{i:05d}": payload(i) for i in range(N)})
    return name


def _dataset(emulator: Emulator, bucket: str, **kwargs: Any) -> BucketMapDataset:
    # No hedged reads: the tests count GETs, and a read slowed by a busy
    # machine would be sent twice.
    gcs = GCSConfig(
        endpoint=emulator.endpoint,
        anonymous=True,
        retry=RETRY,
        hedge=HedgeConfig(enabled=False),
    )
    return BucketMapDataset.from_prefix(f"gs://{bucket}/train/", gcs=gcs, **kwargs)


def _gets(emulator: Emulator) -> int:
    return int(emulator.stats()["by_op"].get("get", 0))


@pytest.mark.parametrize(
    ("context", "compose", "persistent"),
    # One spawned pair of workers, kept across the epochs: a spawned process
    # imports torch (about 1.7 CPU s).
    [("fork", False, True), ("fork", None, False), ("fork", False, False), ("spawn", True, True)],
)
def test_epochs_through_workers_in_the_samplers_order_each_object_read_once(
    emulator: Emulator,
    bucket: str,
    context: str,
    compose: bool | None,
    persistent: bool,
    bucket_kind: str,
) -> None:
    # None: the default, which composes when reading ahead.
    config = None if compose is None else ComposeConfig(enabled=compose)
    ds = _dataset(emulator, bucket, compose=config, fetch=FetchConfig(reads_in_flight=24))
    sampler = BucketBatchSampler(ds, batch_size=16, seed=21)
    loader = DataLoader(
        ds,
        batch_sampler=sampler,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=persistent,
        collate_fn=_as_list,
    )
    epochs = []
    composes = emulator.stats()["by_op"].get("compose", 0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        before = _gets(emulator)
        seen = [sample for batch in loader for sample in batch]
        assert seen == [payload(i) for batch in sampler for i in batch]
        assert sorted(seen) == sorted(payload(i) for i in range(N))
        if compose is False:
            # Each worker followed its own batches: nothing read twice, or in vain.
            assert _gets(emulator) - before == N
        epochs.append(seen)
    assert epochs[0] != epochs[1]
    composed = emulator.stats()["by_op"].get("compose", 0) - composes
    # A zonal bucket has no compose: turned off (one INFO line), never asked.
    assert (composed > 0) is (compose is not False and bucket_kind == "regional")
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []


@pytest.mark.parametrize(("context", "compose"), [("fork", None), ("fork", False), ("spawn", None)])
def test_a_plain_shuffling_dataloader_reads_ahead_in_torchs_order(
    emulator: Emulator, bucket: str, context: str, compose: bool | None, bucket_kind: str
) -> None:
    # No sampler of torchbucket's: DataLoader(shuffle=True) builds torch's
    # RandomSampler, whose order the dataset takes as the sampler sizes it
    # (datasets/_observed.py). The batches are torch's, and the workers read
    # ahead: with compose off each object once, with the default compose on
    # (only ever on when reading ahead) groups composed and deleted.
    config = None if compose is None else ComposeConfig(enabled=compose)
    ds = _dataset(emulator, bucket, compose=config, fetch=FetchConfig(reads_in_flight=24))
    loader = DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=_as_list,
    )
    composes = emulator.stats()["by_op"].get("compose", 0)
    for epoch in range(2):
        torch.manual_seed(epoch)
        before = _gets(emulator)
        seen = [sample for batch in loader for sample in batch]
        torch.manual_seed(epoch)
        order = [
            int(i) for batch in DataLoader(range(N), batch_size=16, shuffle=True) for i in batch
        ]
        assert seen == [payload(i) for i in order]
        if compose is False:
            assert _gets(emulator) - before == N
    composed = emulator.stats()["by_op"].get("compose", 0) - composes
    # A zonal bucket has no compose (see the test above).
    assert (composed > 0) is (compose is None and bucket_kind == "regional")
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []


def test_a_split_reads_ahead_in_a_plain_dataloader_over_http(
    emulator: Emulator, bucket: str, bucket_kind: str
) -> None:
    # ds.split: random_split's parts, each a dataset of its own that reads
    # ahead (random_split's Subsets are read a batch at a time, compose off).
    ds = _dataset(emulator, bucket, fetch=FetchConfig(reads_in_flight=24))
    train, val = ds.split([0.75, 0.25], generator=torch.Generator().manual_seed(4))
    ref = torch.utils.data.random_split(
        range(N), [0.75, 0.25], generator=torch.Generator().manual_seed(4)
    )
    composes = emulator.stats()["by_op"].get("compose", 0)
    before = _gets(emulator)
    for part, subset in ((train, ref[0]), (val, ref[1])):
        loader = DataLoader(part, batch_size=16, shuffle=True, num_workers=2, collate_fn=_as_list)
        torch.manual_seed(1)
        seen = [sample for batch in loader for sample in batch]
        torch.manual_seed(1)
        order = [
            int(i) for b in DataLoader(range(len(part)), batch_size=16, shuffle=True) for i in b
        ]
        assert seen == [payload(subset.indices[k]) for k in order]
    composed = emulator.stats()["by_op"].get("compose", 0) - composes
    # A zonal bucket has no compose; each object is then read once.
    assert (composed > 0) is (bucket_kind == "regional")
    if bucket_kind != "regional":
        assert _gets(emulator) - before == N
    assert stored_names(emulator, bucket, COMPOSITE_PREFIX) == []


def test_reads_ahead_of_the_batch_asked_for_over_http(emulator: Emulator, bucket: str) -> None:
    ds = _dataset(
        emulator,
        bucket,
        compose=ComposeConfig(enabled=False),
        fetch=FetchConfig(reads_in_flight=16),
    )
    batches = list(BucketBatchSampler(ds, batch_size=8, seed=2))
    before = _gets(emulator)
    assert ds.__getitems__(batches[0]) == [payload(i) for i in batches[0]]
    # Nothing else asked for: the next batches are read anyway, up to the bound.
    assert wait_for(lambda: _gets(emulator) - before > 8 + 8)
    time.sleep(0.3)
    # The window: 4 x prefetch objects beyond those handed over, which are
    # taken from it a chunk (prefetch // 4) at a time.
    assert _gets(emulator) - before <= 8 + 4 * 16 + 16 // 4 - 1
    rest = [sample for batch in batches[1:] for sample in ds.__getitems__(batch)]
    assert rest == [payload(i) for batch in batches[1:] for i in batch]
    assert _gets(emulator) - before == N


def test_a_batch_does_not_wait_for_the_next_batchs_reads(emulator: Emulator, bucket: str) -> None:
    # The window hands results over a chunk (prefetch // 4 = 16 here) at a
    # time. A batch of 20 needs 4 more after its first chunk; it used to wait
    # for a whole second chunk, so for the next batch's first reads too. One of
    # those stalls here for 60 s (one attempt, no hedge: nothing rescues it).
    gcs = GCSConfig(
        endpoint=emulator.endpoint,
        anonymous=True,
        retry=RetryConfig(initial_backoff=0.01, read_timeout=90.0, max_attempts=1),
        hedge=HedgeConfig(enabled=False),
    )
    ds = BucketMapDataset.from_prefix(
        f"gs://{bucket}/train/",
        gcs=gcs,
        compose=ComposeConfig(enabled=False),
        fetch=FetchConfig(reads_in_flight=64),
    )
    batches = list(BucketBatchSampler(ds, batch_size=20, seed=3))
    emulator.add_fault("get", "stall", match=f"train/{batches[1][3]:05d}", stall_seconds=60.0)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(ds.__getitems__(batches[0])), daemon=True)
    reader.start()
    reader.join(timeout=30.0)
    assert not reader.is_alive(), "the first batch waited for a read of the second"
    assert got == [payload(i) for i in batches[0]]


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_resumes_through_stateful_dataloader_over_http(emulator: Emulator, bucket: str) -> None:
    def make() -> StatefulDataLoader:
        ds = _dataset(emulator, bucket, fetch=FetchConfig(reads_in_flight=12))
        return StatefulDataLoader(
            ds,
            batch_sampler=BucketBatchSampler(ds, batch_size=16, seed=4),
            num_workers=2,
            multiprocessing_context="fork",
        )

    def set_epoch(loader: StatefulDataLoader, epoch: int) -> None:
        loader.batch_sampler.set_epoch(epoch)

    check_resumable(make, epochs=2, set_epoch=set_epoch, key=tuple)
