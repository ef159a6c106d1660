"""One rule on every read path: a corrupt answer is read again; one that persists
is an ``IntegrityError``, over HTTP against the emulator.

The emulator's ``corrupt`` fault flips a byte of a read answer's body (headers,
the object's CRC32C included, stay honest). Each path meets it once, three
times, and always (with a short retry deadline): the first two give the exact
bytes, the last an ``IntegrityError`` naming the object, never a
``DeadlineExceededError`` and never wrong bytes.
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.cli import main
from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError
from torchbucket.storage.gcs import GCSConfig, GCSStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from wait_helper import wait_for

pytestmark = pytest.mark.emulator

N = 12
MODES = {"once": 1, "thrice": 3, "always": None}
FAST = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=20.0, read_timeout=5.0)
SHORT = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=1.0, read_timeout=5.0)


def payload(i: int) -> bytes:
    return f"object-{i:03d};".encode() * (5 + i)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"ri-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"train/{i:03d}": payload(i) for i in range(N)})
    return name


def gcs(emulator: Emulator, mode: str) -> GCSConfig:
    retry = SHORT if mode == "always" else FAST
    return GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=retry)


def fire(emulator: Emulator, mode: str, match: str | None = None) -> None:
    emulator.add_fault("get", "corrupt", count=MODES[mode], match=match)


def fired(emulator: Emulator) -> int:
    return sum(rule["fired"] for rule in emulator.faults())


@pytest.mark.parametrize("mode", list(MODES))
def test_store_get(emulator: Emulator, bucket: str, mode: str) -> None:
    store = GCSStore(bucket, config=gcs(emulator, mode))
    try:
        fire(emulator, mode)
        if mode == "always":
            with pytest.raises(IntegrityError) as caught:
                runtime.run(store.get("train/003"))
            assert f"gs://{bucket}/train/003" in str(caught.value)
            assert "CRC32C" in str(caught.value)  # "mismatch" (JSON), "does not match" (gRPC)
        else:
            assert runtime.run(store.get("train/003")) == payload(3)
            assert fired(emulator) == MODES[mode]
    finally:
        runtime.run(store.close())


@pytest.mark.parametrize("compose", [False, True], ids=["direct", "compose"])
@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("mode", list(MODES))
def test_dataset_epoch(
    emulator: Emulator, bucket: str, mode: str, kind: str, compose: bool
) -> None:
    uri = f"gs://{bucket}/train/"
    config = ComposeConfig(enabled=compose, max_composite_object_size=4000)
    ds: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(uri, gcs=gcs(emulator, mode), compose=config)
    else:
        ds = BucketIterableDataset.from_prefix(uri, gcs=gcs(emulator, mode), compose=config)
    fire(emulator, mode)

    def epoch() -> list[bytes]:
        if kind == "map":
            return list(ds.__getitems__(list(range(N))))
        return list(ds)

    if mode == "always":
        with pytest.raises(IntegrityError) as caught:  # not DeadlineExceededError
            epoch()
        assert f"gs://{bucket}/train/" in str(caught.value)
    else:
        got = epoch()
        assert sorted(got) == sorted(payload(i) for i in range(N))
        assert fired(emulator) == MODES[mode]
    emulator.clear_faults()
    # An epoch that failed has handed its composites and anchor to the
    # background deletes; on a loaded machine they may still be in flight.
    # A leaked one never goes.
    assert wait_for(lambda: emulator.object_names(bucket, "dataflux-composed-objects/") == []), (
        emulator.object_names(bucket, "dataflux-composed-objects/")
    )


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(300, 256, generator=g)}  # about 300 KB: 5 ranges of 64 KiB


@pytest.mark.parametrize("mode", list(MODES))
def test_checkpoint_load(emulator: Emulator, bucket: str, mode: str) -> None:
    config = CheckpointConfig(part_size=64 * 1024, min_part_size=1, range_size=64 * 1024)
    checkpoint = BucketCheckpoint(config=config, gcs=gcs(emulator, mode))
    uri = f"gs://{bucket}/ck/c.pt"
    original = _state()
    with checkpoint.writer(uri) as f:
        torch.save(original, f)
    fire(emulator, mode)
    if mode == "always":
        with pytest.raises(IntegrityError) as caught, checkpoint.reader(uri) as f:
            torch.load(f)
        assert uri in str(caught.value)
    else:
        with checkpoint.reader(uri) as f:
            loaded = torch.load(f)
        assert torch.equal(loaded["w"], original["w"])
        assert fired(emulator) == MODES[mode]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", list(MODES))
def test_cp_download(
    emulator: Emulator,
    bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    mode: str,
    streamed: bool,
) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB
    emulator.seed(bucket, {"big/model.bin": big})
    threshold = "1KiB" if streamed else "64MiB"
    deadline = "1" if mode == "always" else "20"
    fire(emulator, mode, match="big/")
    out = tmp_path / "model.bin"
    argv = ["--endpoint", emulator.endpoint, "--deadline", deadline, "cp"]
    argv += ["--stream-threshold", threshold, f"gs://{bucket}/big/model.bin", str(out)]
    with caplog.at_level(logging.WARNING):
        code = main(argv)
    if mode == "always":
        assert code == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("torchbucket: error: ") and len(err.splitlines()) == 1
        assert f"gs://{bucket}/big/model.bin" in err and "CRC32C" in err
        assert list(tmp_path.iterdir()) == []  # nothing half-written
    else:
        assert code == 0
        assert out.read_bytes() == big
        assert fired(emulator) == MODES[mode]
        assert list(tmp_path.iterdir()) == [out]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("mode", list(MODES))
def test_dcp_load(emulator: Emulator, bucket: str, mode: str) -> None:
    """Ranges of a DCP file carry no checksum of their own: the file's, combined, is checked."""
    import torch.distributed.checkpoint as dcp

    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter

    config = CheckpointConfig(part_size=32 * 1024, min_part_size=1, range_size=16 * 1024)
    uri = f"gs://{bucket}/dcp"
    g = torch.Generator().manual_seed(3)
    original = {"w": torch.randn(128, 128, generator=g), "b": torch.randn(128, generator=g)}
    writer = BucketStorageWriter(uri, checkpoint=config, gcs=gcs(emulator, mode))
    dcp.save(original, storage_writer=writer)
    fire(emulator, mode, match=".distcp")
    target = {"w": torch.zeros(128, 128), "b": torch.zeros(128)}
    reader = BucketStorageReader(uri, checkpoint=config, gcs=gcs(emulator, mode))
    if mode == "always":
        from torch.distributed.checkpoint.api import CheckpointException

        with pytest.raises(CheckpointException) as caught:  # torch wraps each rank's failure
            dcp.load(target, storage_reader=reader)
        error, _ = caught.value.failures[0]
        assert isinstance(error, IntegrityError), repr(error)
        assert re.search(rf"{uri}/__0_0\.\w+\.distcp", str(error))  # the data file
    else:
        dcp.load(target, storage_reader=reader)
        assert torch.equal(target["w"], original["w"]) and torch.equal(target["b"], original["b"])
        assert fired(emulator) == MODES[mode]
