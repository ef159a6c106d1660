"""The gcs-torch-dataflux names, mapped onto torchbucket (memory store)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader

from torchbucket import dataflux, runtime
from torchbucket.compose import DEFAULT_MAX_COMPOSITE_OBJECT_SIZE
from torchbucket.config import RetryConfig
from torchbucket.errors import NotFoundError
from torchbucket.storage.memory import MemoryStore, delete_memory_bucket

N = 40


@pytest.fixture
def bucket() -> Iterator[str]:
    name = f"df-{uuid.uuid4().hex[:8]}"
    store = MemoryStore(name)

    async def seed() -> None:
        for i in range(N):
            await store.put(f"train/{i:03d}", f"img-{i}".encode())
        await store.put("val/0", b"validation")

    runtime.run(seed())
    yield name
    delete_memory_bucket(name)


def test_config_takes_dataflux_parameters() -> None:
    config = dataflux.Config(
        sort_listing_results=True,
        max_composite_object_size=1_000_000,
        num_processes=8,
        prefix="train/",
        max_listing_retries=5,
        threads_per_process=4,
        list_retry_config=None,
        download_retry_config=None,
    )
    assert config.prefix == "train/" and config.max_composite_object_size == 1_000_000
    assert dataflux.Config(disable_compose=True).max_composite_object_size == 0
    positional = dataflux.Config(False, 5000, 2, "p/")
    assert positional.max_composite_object_size == 5000 and positional.prefix == "p/"


def test_map_style_reads_the_prefix_with_dataflux_arguments(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="torchbucket"):
        ds = dataflux.DataFluxMapStyleDataset(
            project_name="proj",
            bucket_name=f"memory://{bucket}",
            config=dataflux.Config(prefix="train/", num_processes=16, threads_per_process=8),
            data_format_fn=lambda b: b.decode(),
            storage_client=object(),
        )
    assert len(ds) == N
    assert ds[3] == "img-3"
    assert ds.__getitems__([0, 39]) == ["img-0", "img-39"]
    assert ds.objects[:2] == [("train/000", 5), ("train/001", 5)]
    assert ds.project_name == "proj" and ds.storage_client is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("num_processes" in r.getMessage() for r in caplog.records)
    assert ds._compose.max_composite_object_size == DEFAULT_MAX_COMPOSITE_OBJECT_SIZE


@pytest.mark.parametrize(
    ("config", "enabled", "cap"),
    [
        (dataflux.Config(prefix="train/", disable_compose=True), False, 0),
        (dataflux.Config(prefix="train/", max_composite_object_size=0), False, 0),
        (dataflux.Config(prefix="train/", max_composite_object_size=12345), True, 12345),
    ],
)
def test_compose_settings_map_onto_compose_config(
    bucket: str, config: dataflux.Config, enabled: bool, cap: int
) -> None:
    ds = dataflux.DataFluxMapStyleDataset("proj", f"memory://{bucket}", config)
    assert ds._compose.enabled is enabled
    assert ds._compose.max_composite_object_size == cap
    assert ds.__getitems__([1, 2]) == [b"img-1", b"img-2"]


def test_iterable_reads_every_object_once_over_workers(bucket: str) -> None:
    ds = dataflux.DataFluxIterableDataset(
        "proj", f"memory://{bucket}", dataflux.Config(prefix="train/")
    )
    assert list(ds) == [f"img-{i}".encode() for i in range(N)]
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sorted(loader) == sorted(f"img-{i}".encode() for i in range(N))
    assert ds.objects[-1] == ("train/039", 6)


def test_whole_bucket_when_no_prefix_and_missing_prefix_is_not_found(bucket: str) -> None:
    ds = dataflux.DataFluxMapStyleDataset("proj", f"memory://{bucket}")
    assert len(ds) == N + 1
    with pytest.raises(NotFoundError):
        dataflux.DataFluxMapStyleDataset(
            "proj", f"memory://{bucket}", dataflux.Config(prefix="nothing/")
        )


class FakeGoogleRetry:
    """The attributes a google.api_core Retry keeps its policy in."""

    _initial = 1.0
    _maximum = 30.0
    _multiplier = 1.5
    _timeout = 600.0


def test_google_retry_policy_becomes_a_retry_config() -> None:
    retry = dataflux._retry(FakeGoogleRetry())
    assert retry == RetryConfig(
        initial_backoff=1.0, max_backoff=30.0, multiplier=1.5, deadline=600.0
    )
    ours = RetryConfig(deadline=5.0)
    assert dataflux._retry(ours) is ours
    assert dataflux._retry(None) is None
