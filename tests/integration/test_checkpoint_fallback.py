"""Checkpoint saves where the XML multipart API is refused or missing, over HTTP.

The emulator models an endpoint without the API by answering every multipart
request (initiate, listing) with the chosen status.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

PART = 64 * 1024
WARNING = "multipart upload is refused or not implemented"


def checkpoint_for(store: Any, **overrides: Any) -> BucketCheckpoint:
    options: dict[str, Any] = {
        "part_size": PART,
        "min_part_size": 1,
        "parts_in_flight": 4,
        "range_size": PART,
    }
    options.update(overrides)
    return BucketCheckpoint(config=CheckpointConfig(**options), gcs=store.config)


def state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(400, 256, generator=g), "seed": seed}  # about 400 KB: 7 parts


def save_and_load(checkpoint: BucketCheckpoint, uri: str, seed: int) -> None:
    original = state(seed)
    with checkpoint.writer(uri) as f:
        torch.save(original, f)
    with checkpoint.reader(uri) as f:
        loaded = torch.load(f)
    assert torch.equal(loaded["w"], original["w"]) and loaded["seed"] == seed


def mpu_requests(emulator: Emulator) -> dict[str, int]:
    return {op: n for op, n in emulator.stats()["by_op"].items() if op.startswith("mpu_")}


@pytest.mark.parametrize("status", ["501", "405", "404", "403"])
def test_a_save_falls_back_to_resumable_once_per_bucket(
    emulator: Emulator,
    gcs_bucket_factory: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    status: str,
) -> None:
    store = gcs_bucket_factory(emulator, prefix="nompu")
    checkpoint = checkpoint_for(store)
    for op in ("mpu_initiate", "mpu_list"):
        emulator.add_fault(op, status, count=None)
    emulator.reset_stats()
    with caplog.at_level(logging.WARNING):
        save_and_load(checkpoint, f"gs://{store.bucket}/ck/c.pt", 1)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings if WARNING in r.getMessage()] != []
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # one warning, no traceback
    assert store.bucket in warnings[0].getMessage()
    assert mpu_requests(emulator) == {"mpu_initiate": 1}  # asked once, never retried
    assert emulator.stats()["by_op"].get("resumable", 0) >= 2

    # Remembered for the bucket: the next save goes resumable without asking.
    caplog.clear()
    emulator.reset_stats()
    with caplog.at_level(logging.WARNING):
        save_and_load(checkpoint, f"gs://{store.bucket}/ck/d.pt", 2)
        save_and_load(checkpoint, f"gs://{store.bucket}/ck/c.pt", 3)  # over the first
    assert mpu_requests(emulator) == {}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_another_bucket_still_uses_multipart(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    refused = gcs_bucket_factory(emulator, prefix="nompu")
    other = gcs_bucket_factory(emulator, prefix="mpu")
    emulator.add_fault("mpu_initiate", "501", count=None, match="ck/only-here")
    save_and_load(checkpoint_for(refused), f"gs://{refused.bucket}/ck/only-here.pt", 1)
    emulator.clear_faults()
    emulator.reset_stats()
    save_and_load(checkpoint_for(other), f"gs://{other.bucket}/ck/c.pt", 2)
    assert mpu_requests(emulator).get("mpu_initiate") == 1
    assert mpu_requests(emulator).get("mpu_complete") == 1


def test_a_failure_that_is_not_a_refusal_still_fails_the_save(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    """A 500 on every initiate is not "no multipart here": the save fails, nothing visible."""
    from torchbucket.config import RetryConfig
    from torchbucket.errors import DeadlineExceededError

    retry = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=1.0)
    store = gcs_bucket_factory(emulator, prefix="nompu", retry=retry)
    checkpoint = checkpoint_for(store)
    uri = f"gs://{store.bucket}/ck/c.pt"
    emulator.add_fault("mpu_initiate", "500", count=None)
    with pytest.raises(DeadlineExceededError) as caught, checkpoint.writer(uri) as f:
        torch.save(state(1), f)
    assert uri in str(caught.value)
    emulator.clear_faults()
    assert runtime.run(store.list_page("ck/")).objects == []


def test_a_resumable_save_never_touches_multipart(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    store = gcs_bucket_factory(emulator, prefix="resumable")
    checkpoint = checkpoint_for(store, upload_method="resumable")
    emulator.reset_stats()
    with caplog.at_level(logging.DEBUG, logger="torchbucket"):
        save_and_load(checkpoint, f"gs://{store.bucket}/ck/c.pt", 1)
        save_and_load(checkpoint, f"gs://{store.bucket}/ck/c.pt", 2)
    assert mpu_requests(emulator) == {}
    assert not [r for r in caplog.records if "multipart" in r.getMessage()]
    assert emulator.stats()["by_op"].get("resumable", 0) >= 4


def test_the_fallback_reaches_the_bytes_in_order(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    """Raw bytes, many small parts: the resumable upload holds them in write order."""
    store = gcs_bucket_factory(emulator, prefix="nompu")
    checkpoint = checkpoint_for(store, part_size=4096, parts_in_flight=8)
    emulator.add_fault("mpu_initiate", "501", count=None)
    data = bytes(range(251)) * 997  # 250 KB in 61 parts of 4 KiB
    uri = f"gs://{store.bucket}/raw.bin"
    with checkpoint.writer(uri) as f:
        for start in range(0, len(data), 1000):
            f.write(data[start : start + 1000])
    assert runtime.run(store.get("raw.bin")) == data
    with checkpoint.reader(uri) as f:
        assert io.BytesIO(f.read()).getvalue() == data
