"""The gcs-torch-dataflux names, mapped onto torchbucket (memory store)."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from memory_helper import memory_bucket
from torch.utils.data import DataLoader

from torchbucket import dataflux, runtime
from torchbucket._uri import parse_uri, uri_text
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.compose import DEFAULT_MAX_COMPOSITE_OBJECT_SIZE
from torchbucket.config import RetryConfig
from torchbucket.dataflux import (
    dataflux_checkpoint,
    dataflux_iterable_dataset,
    dataflux_mapstyle_dataset,
)
from torchbucket.dataflux._common import retry_config
from torchbucket.dataflux.multipart_upload import multipart
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset
from torchbucket.errors import ConfigError, NotFoundError
from torchbucket.storage.memory import MemoryStore

N = 40


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket(
        "df",
        [*((f"train/{i:03d}", f"img-{i}".encode()) for i in range(N)), ("val/0", b"validation")],
    ) as name:
        yield name


def put(bucket: str, name: str, data: bytes) -> None:
    runtime.run(MemoryStore(bucket).put(name, data))


def test_each_config_takes_dataflux_parameters_in_dataflux_order() -> None:
    config = dataflux_mapstyle_dataset.Config(
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
    # Positional: the sixth parameter is threads_per_process on the map-style
    # Config and disable_compose on the iterable one, as in dataflux.
    mapstyle = dataflux_mapstyle_dataset.Config(False, 5000, 2, "p/", 3, True)
    assert mapstyle.threads_per_process is True and mapstyle.disable_compose is False
    assert mapstyle.compose_config().enabled
    iterable = dataflux_iterable_dataset.Config(False, 5000, 2, "p/", 3, True)
    assert iterable.disable_compose is True and iterable.max_composite_object_size == 0
    assert not iterable.compose_config().enabled
    with pytest.raises(TypeError):
        dataflux_iterable_dataset.Config(threads_per_process=4)  # type: ignore[call-arg]


def test_map_style_reads_the_prefix_with_dataflux_arguments(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="torchbucket"):
        ds = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
            project_name="proj",
            bucket_name=f"memory://{bucket}",
            config=dataflux_mapstyle_dataset.Config(
                prefix="train/", num_processes=16, threads_per_process=8
            ),
            data_format_fn=lambda b: b.decode(),
            storage_client=object(),
        )
    assert len(ds) == N
    assert ds[3] == "img-3"
    assert ds.__getitems__([0, 39]) == ["img-0", "img-39"]
    assert ds.objects[:2] == [("train/000", 5), ("train/001", 5)]
    assert ds.project_name == "proj" and ds.storage_client is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("storage_client" in r.getMessage() for r in caplog.records)
    # The default cap (None) is torchbucket's default: a batch read on its
    # own is not composed (it would wait for the compose round trip).
    assert dataflux_mapstyle_dataset.Config().compose_config() is None
    assert ds.last_epoch_stats.by_op.get("compose", 0) == 0


def test_objects_is_a_list_kept_between_accesses_and_what_the_dataset_reads(bucket: str) -> None:
    ds = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
        "proj", f"memory://{bucket}", dataflux_mapstyle_dataset.Config(prefix="train/")
    )
    objects = ds.objects
    assert isinstance(objects, list) and objects is ds.objects
    assert objects[-1] == ("train/039", 6)
    ds.objects = ds.objects[10:13]
    assert len(ds) == 3 and ds[0] == b"img-10"
    ds.objects.reverse()
    assert [ds[i] for i in range(len(ds))] == [b"img-12", b"img-11", b"img-10"]
    ds.objects.append(("val/0", 10))
    assert len(ds) == 4 and ds.__getitems__([3]) == [b"validation"]
    # A copy in a DataLoader worker reads the same list.
    clone = pickle.loads(pickle.dumps(ds))
    assert [clone[i] for i in range(4)] == [b"img-12", b"img-11", b"img-10", b"validation"]


def test_objects_from_the_listing_stay_pinned_to_their_generation(bucket: str) -> None:
    ds = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
        "proj", f"memory://{bucket}", dataflux_mapstyle_dataset.Config(prefix="train/")
    )
    ds.objects = ds.objects[:2]
    put(bucket, "train/001", b"rewritten")
    assert ds[0] == b"img-0"
    with pytest.raises(NotFoundError):
        ds[1]


def test_iterable_follows_an_assigned_objects_list(bucket: str) -> None:
    ds = dataflux_iterable_dataset.DataFluxIterableDataset(
        "proj", f"memory://{bucket}", dataflux_iterable_dataset.Config(prefix="train/")
    )
    assert list(ds) == [f"img-{i}".encode() for i in range(N)]
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sorted(loader) == sorted(f"img-{i}".encode() for i in range(N))
    ds.objects = [o for o in ds.objects if o[0].endswith("7")]
    assert list(ds) == [b"img-7", b"img-17", b"img-27", b"img-37"]


@pytest.mark.parametrize(
    "cls", [dataflux.DataFluxMapStyleDataset, dataflux.DataFluxIterableDataset]
)
def test_an_empty_prefix_is_an_empty_dataset(bucket: str, cls: type) -> None:
    ds = cls("proj", f"memory://{bucket}", dataflux.Config(prefix="nothing/"))
    assert ds.objects == [] and list(ds) == []
    whole = cls("proj", f"memory://{bucket}")
    assert len(whole.objects) == N + 1


@pytest.mark.parametrize(
    ("config", "batch", "ahead", "cap"),
    [
        (dataflux.Config(prefix="train/", disable_compose=True), False, False, 0),
        (dataflux.Config(prefix="train/", max_composite_object_size=0), False, False, 0),
        (
            dataflux.Config(prefix="train/", max_composite_object_size=0, disable_compose=True),
            False,
            False,
            0,
        ),
        (dataflux.Config(prefix="train/", max_composite_object_size=12345), True, True, 12345),
        # The default cap (None): torchbucket's defaults, compose only reading ahead.
        (dataflux.Config(prefix="train/"), False, True, DEFAULT_MAX_COMPOSITE_OBJECT_SIZE),
    ],
)
def test_compose_settings_map_onto_compose_config(
    bucket: str, config: dataflux.Config, batch: bool, ahead: bool, cap: int
) -> None:
    ds = dataflux.DataFluxMapStyleDataset("proj", f"memory://{bucket}", config)
    # Batch at a time (any sampler it cannot read ahead of), and reading ahead.
    assert (ds._compose.enabled, ds._ahead_compose.enabled) == (batch, ahead)
    # dataflux's Config reads as in dataflux (a cap of 0 when off); the
    # ComposeConfig it maps to says off with enabled=False and keeps a cap.
    if ahead:
        assert ds._ahead_compose.max_composite_object_size == cap
    else:
        assert config.max_composite_object_size == cap
    assert ds.__getitems__([1, 2]) == [b"img-1", b"img-2"]


class FakeGoogleRetry:
    """The attributes a google.api_core Retry keeps its policy in."""

    _initial = 1.0
    _maximum = 30.0
    _multiplier = 1.5
    _timeout = 600.0


def test_google_retry_policy_becomes_a_retry_config() -> None:
    retry = retry_config(FakeGoogleRetry())
    assert retry == RetryConfig(
        initial_backoff=1.0, max_backoff=30.0, multiplier=1.5, deadline=600.0
    )
    ours = RetryConfig(deadline=5.0)
    assert retry_config(ours) is ours
    assert retry_config(None) is None


def test_dataflux_checkpoint_takes_bucket_relative_names(bucket: str) -> None:
    ckpt = dataflux_checkpoint.DatafluxCheckpoint(
        project_name="proj", bucket_name=f"memory://{bucket}"
    )
    with ckpt.writer("checkpoints/epoch0.ckpt") as writer:
        torch.save({"w": torch.arange(5)}, writer)
    assert runtime.run(MemoryStore(bucket).head("checkpoints/epoch0.ckpt")).size > 0
    with ckpt.reader("checkpoints/epoch0.ckpt") as reader:
        assert torch.equal(torch.load(reader)["w"], torch.arange(5))
    # The extension: the tensors mapped from the download, no copy.
    assert torch.equal(
        ckpt.load("checkpoints/epoch0.ckpt", weights_only=True)["w"], torch.arange(5)
    )


def test_multipart_upload_from_bytesio(bucket: str) -> None:
    import io

    data = io.BytesIO(b"x" * 1000)
    data.seek(500)
    multipart.upload_chunks_concurrently_from_bytesio(data, f"memory://{bucket}/up/one")
    assert runtime.run(MemoryStore(bucket).get("up/one")) == b"x" * 1000
    with pytest.raises(TypeError, match="blob"):
        multipart.upload_chunks_concurrently_from_bytesio(data, object())


def test_gcs_scheme_is_gs() -> None:
    assert parse_uri("gcs://bkt/a/b") == parse_uri("gs://bkt/a/b")
    assert str(parse_uri("gcs://bkt/a")) == "gs://bkt/a"
    assert uri_text(Path("gcs://bkt/run") / "x") == "gcs://bkt/run/x"
    assert uri_text(Path("file:///tmp/x")) == "file:///tmp/x"
    assert uri_text(Path("relative/x")) == "relative/x"


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: BucketCheckpoint(config="my-project"), "config"),  # type: ignore[arg-type]
        (lambda: BucketCheckpoint(config=CheckpointConfig(), gcs="my-bucket"), "gcs"),  # type: ignore[arg-type]
        (
            lambda: dataflux_checkpoint.DatafluxCheckpoint("p", 7),  # type: ignore[arg-type]
            "bucket_name",
        ),
        (
            lambda: dataflux.DataFluxMapStyleDataset("p", "b", "train/"),  # type: ignore[arg-type]
            "config",
        ),
        (lambda: BucketMapDataset("gs://b/x"), "catalog"),  # type: ignore[arg-type]
        (
            lambda: BucketMapDataset.from_prefix("memory://b/", gcs="p"),  # type: ignore[arg-type]
            "gcs",
        ),
        (
            lambda: BucketIterableDataset.from_prefix("memory://b/", compose="yes"),  # type: ignore[arg-type]
            "compose",
        ),
        (
            lambda: dataflux_mapstyle_dataset.Config(prefix=3),  # type: ignore[arg-type]
            "prefix",
        ),
    ],
)
def test_constructors_refuse_a_wrong_type_naming_the_parameter(
    make: object, parameter: str
) -> None:
    with pytest.raises(ConfigError, match=rf"\b{parameter} must be"):
        make()  # type: ignore[operator]


def test_lightning_and_dcp_constructors_refuse_a_wrong_type() -> None:
    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
    from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO

    with pytest.raises(ConfigError, match=r"checkpoint must be .*DatafluxLightningCheckpoint"):
        BucketCheckpointIO(checkpoint="my-project")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bucket_checkpoint must be"):
        AsyncBucketCheckpointIO(bucket_checkpoint="gs://b/x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_pending must be"):
        AsyncBucketCheckpointIO(max_pending="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="checkpoint must be"):
        BucketStorageWriter("gs://bkt/x", checkpoint="my-project")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="uri must be"):
        BucketStorageReader("relative/dir")
    # dataflux's Path form of a gcs:// URI is a URI.
    assert BucketStorageWriter(Path("gcs://bkt/run")).uri == "gcs://bkt/run"


def test_importing_the_compat_layer_does_not_import_lightning() -> None:
    code = (
        "import sys\n"
        "from torchbucket.dataflux import dataflux_mapstyle_dataset, dataflux_checkpoint\n"
        "from torchbucket.dataflux.lightning import GCSDistributedWriter\n"
        "assert 'lightning' not in sys.modules, 'lightning imported'\n"
        "from torchbucket.dataflux.lightning import DatafluxLightningCheckpoint\n"
        "assert 'lightning' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
