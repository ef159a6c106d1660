"""DataLoader workers freeze the garbage collector before their first read
(``FetchConfig.freeze_gc``, datasets/_worker.py), over HTTP against the
emulator: in every worker, for the map-style and the iterable dataset, never in
the main process, and not at all when turned off."""

from __future__ import annotations

import gc
import os
import uuid
from typing import Any

import pytest
from torch.utils.data import DataLoader

from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import ConfigError
from torchbucket.storage.gcs import GCSConfig

pytestmark = pytest.mark.emulator

N = 48
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


def payload(i: int) -> bytes:
    return f"gc-freeze-{i:03d};".encode() * (1 + i % 5)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"gcf-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"s/{i:03d}": payload(i) for i in range(N)})
    return name


def seen_by_worker(data: bytes) -> tuple[int, int, bytes]:
    """A data_format_fn run in the worker: its pid, its frozen count, the bytes."""
    return os.getpid(), gc.get_freeze_count(), data


def _as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("freeze", [True, False])
def test_workers_freeze_before_their_first_read(
    emulator: Emulator, bucket: str, kind: str, freeze: bool
) -> None:
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    fetch = FetchConfig(freeze_gc=freeze)
    cls = BucketMapDataset if kind == "map" else BucketIterableDataset
    ds = cls.from_prefix(f"gs://{bucket}/s/", gcs=gcs, fetch=fetch, data_format_fn=seen_by_worker)
    frozen_in_main = gc.get_freeze_count()
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_as_list,
    )
    samples = [s for batch in loader for s in batch]

    assert sorted(data for _, _, data in samples) == sorted(payload(i) for i in range(N))
    pids = {pid for pid, _, _ in samples}
    assert len(pids) == 2 and os.getpid() not in pids
    counts = [count for _, count, _ in samples]
    if freeze:
        # Every sample, the first of each worker included: the freeze came
        # before the first read, and it took what the worker inherited.
        assert min(counts) > frozen_in_main + 10_000
    else:
        assert set(counts) == {frozen_in_main}
    assert gc.get_freeze_count() == frozen_in_main  # the main process is left alone


def test_freeze_gc_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"FetchConfig\.freeze_gc"):
        FetchConfig(freeze_gc="yes")  # type: ignore[arg-type]
