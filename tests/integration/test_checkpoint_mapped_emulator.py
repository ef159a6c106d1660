"""``BucketCheckpoint.load``'s paths without a copy over HTTP (issue 45): bad bytes still fail.

The default load (``weights_only=True``) downloads into anonymous pages that
torch's zip loader slices the tensors out of; ``weights_only=False`` into a
memfd that ``torch.load(..., mmap=True)`` maps; the dataflux layer's ``load``
and Lightning's ``load_checkpoint`` are ``BucketCheckpoint.load``. On each, a
checkpoint whose bytes in the bucket are not the object's (every read of it
corrupt) fails with an ``IntegrityError`` naming it after a few reads, not at
the retry deadline: on a regional bucket after a second whole read (a JSON
range carries no checksum; the load checks the object's), on a zonal one at
the ``retry.CORRUPT_ANSWERS``-th corrupt answer (each gRPC chunk is checked
as it comes); one rewritten by another writer while it loads fails with a
``NotFoundError`` saying so, instead of mixing two checkpoints' bytes.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.config import HedgeConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.runtime import retry

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd: Linux"),
]

PART = 64 * 1024
CONFIG = CheckpointConfig(part_size=PART, min_part_size=1, range_size=PART, reads_in_flight=1)


@pytest.fixture
def store(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="mapped")


def state(seed: int) -> dict[str, Any]:
    return {"w": torch.randn(256, 256, generator=torch.Generator().manual_seed(seed))}


def saved(
    checkpoint: BucketCheckpoint, bucket: str, kind: str, sd: dict[str, Any]
) -> tuple[str, str]:
    """Save ``sd`` under a fresh name starting with ``kind``; return (name, uri)."""
    name = f"{kind}-{uuid.uuid4().hex[:8]}.pt"
    uri = f"gs://{bucket}/{name}"
    checkpoint.save(sd, uri)
    return name, uri


def load_through(way: str, checkpoint: BucketCheckpoint, uri: str) -> Any:
    """A load by one of the APIs that end in ``BucketCheckpoint.load``."""
    if way == "aliased":  # weights_only=True: torch's loader over the download
        return checkpoint.load(uri, weights_only=True)
    if way == "mapped":  # weights_only=False: torch.load(mmap=True) of a memfd
        return checkpoint.load(uri, weights_only=False)
    if way == "dataflux":
        from torchbucket.dataflux.dataflux_checkpoint import DatafluxCheckpoint

        bucket = uri.removeprefix("gs://").split("/")[0]
        compat = DatafluxCheckpoint("project", bucket, checkpoint=checkpoint)
        return compat.load(uri.removeprefix(f"gs://{bucket}/"), weights_only=True)
    from torchbucket.lightning import BucketCheckpointIO

    return BucketCheckpointIO(bucket_checkpoint=checkpoint).load_checkpoint(uri, weights_only=True)


@pytest.mark.parametrize("way", ["aliased", "mapped", "dataflux", "lightning"])
def test_a_checkpoint_corrupt_in_the_bucket_fails_the_load_naming_it(
    emulator: Emulator, store: Any, way: str
) -> None:
    checkpoint = BucketCheckpoint(config=CONFIG, gcs=store.config)
    name, uri = saved(checkpoint, store.bucket, "rot", state(1))
    ranges = -(-runtime.run(store.head(name)).size // PART)
    emulator.add_fault("get", "corrupt", nth=1, count=None, match=name)
    gets_before = emulator.stats()["by_op"].get("get", 0)
    with pytest.raises(IntegrityError, match=r"(?i)crc32c") as info:
        load_through(way, checkpoint, uri)
    assert uri in str(info.value)
    # A few reads, not until the retry deadline (hundreds of GETs): regional,
    # two whole reads; zonal, a range's corrupt answers (a GET is a stream).
    gets = emulator.stats()["by_op"].get("get", 0) - gets_before
    assert gets <= max(2 * ranges, retry.CORRUPT_ANSWERS)


@pytest.mark.parametrize("way", ["aliased", "mapped"])
def test_a_pickle_damaged_on_the_way_is_read_again_and_loads(
    emulator: Emulator, store: Any, way: str
) -> None:
    # The first GET's answer comes back with its middle byte flipped, once:
    # inside data.pkl (a 100 KB string here, the first range 64 KiB), where
    # it makes the string's UTF-8 invalid. The default load unpickles beside
    # the CRC32C pass; what torch says of the damaged bytes is dropped with
    # them, the bytes read again, and the load returns the checkpoint.
    checkpoint = BucketCheckpoint(config=CONFIG, gcs=store.config)
    original = {**state(4), "meta": "x" * 100_000}
    name, uri = saved(checkpoint, store.bucket, "flip", original)
    emulator.add_fault("get", "corrupt", nth=1, count=1, match=name)
    loaded = load_through(way, checkpoint, uri)
    assert [rule["fired"] for rule in emulator.faults()] == [1]
    assert loaded["meta"] == original["meta"]
    assert torch.equal(loaded["w"], original["w"])


@pytest.mark.parametrize("way", ["aliased", "mapped"])
def test_a_checkpoint_rewritten_during_the_load_fails_it(
    emulator: Emulator, store: Any, bucket_kind: str, way: str
) -> None:
    # No hedge of the held range and no timeout shorter than the hold: the
    # range is read again only after the rewrite has landed.
    gcs = dataclasses.replace(
        store.config,
        hedge=HedgeConfig(enabled=False),
        retry=dataclasses.replace(store.config.retry, read_timeout=30.0, attempt_timeout=30.0),
    )
    checkpoint = BucketCheckpoint(config=CONFIG, gcs=gcs)
    name, uri = saved(checkpoint, store.bucket, "moving", state(1))
    # The second range is held (then its connection reset, or its stream
    # broken); while it is held another writer saves a new checkpoint there,
    # and the range read again finds its generation gone (on a zonal bucket,
    # the data object the old pointer named, deleted by the new save). The
    # load reads one range at a time (reads_in_flight=1): over HTTP its second
    # GET; over gRPC each range goes on a stream of its own (a stream ends
    # once it has no read left), and the emulator counts a stream's open and
    # each range it reads as a get (test_emulator_grpc_faults.py): the fourth.
    second_range = {"regional": 2, "zonal": 4}[bucket_kind]
    # The hold outlasts the rewrite (a small save: well under a second, even
    # at a load average of 7) with room to spare.
    emulator.add_fault("get", "stall", nth=second_range, match=name, stall_seconds=4.0)

    def held() -> bool:
        return any(rule["kind"] == "stall" and rule["fired"] for rule in emulator.faults())

    def rewrite() -> None:
        deadline = time.monotonic() + 30
        while not held():
            assert time.monotonic() < deadline, "the load never reached its second range"
            time.sleep(0.05)
        BucketCheckpoint(config=CONFIG, gcs=store.config).save(state(2), uri)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        with pytest.raises(NotFoundError, match="rewritten") as info:
            load_through(way, checkpoint, uri)
    finally:
        writer.join()
    assert uri in str(info.value)
    assert torch.equal(load_through(way, checkpoint, uri)["w"], state(2)["w"])
