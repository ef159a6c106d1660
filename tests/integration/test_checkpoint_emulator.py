"""BucketCheckpoint against the emulator over HTTP: XML multipart, resumable, faults."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bucket_kinds import stored_names
from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig, abort_incomplete_uploads
from torchbucket.emulator import Emulator
from torchbucket.errors import NotFoundError, PermissionDeniedError

pytestmark = pytest.mark.emulator

PART = 64 * 1024


def config(**overrides: Any) -> CheckpointConfig:
    options: dict[str, Any] = {
        "part_size": PART,
        "min_part_size": 1,
        "parts_in_flight": 4,
        "range_size": PART,
    }
    options.update(overrides)
    return CheckpointConfig(**options)


def state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(400, 256, generator=g),
        "b": torch.arange(seed, seed + 7),
        "seed": seed,
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert torch.equal(a["w"], b["w"]) and torch.equal(a["b"], b["b"]) and a["seed"] == b["seed"]


@pytest.fixture
def store(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="ckpt")


def checkpoint_for(store: Any, **overrides: Any) -> BucketCheckpoint:
    return BucketCheckpoint(config=config(**overrides), gcs=store.config)


@pytest.mark.parametrize("method", ["multipart", "resumable"])
def test_round_trip_over_http(emulator: Emulator, store: Any, method: str) -> None:
    checkpoint = checkpoint_for(store, upload_method=method)
    uri = f"gs://{store.bucket}/run/step-1.pt"
    original = state(1)
    with checkpoint.writer(uri) as f:
        torch.save(original, f)
    assert f.info is not None and f.info.size > 4 * PART
    assert stored_names(emulator, store.bucket) == ["run/step-1.pt"]
    with checkpoint.reader(uri) as r:
        assert r.info.generation == f.info.generation
        loaded = torch.load(r, weights_only=True, map_location="cpu")
    assert_same(loaded, original)


def test_exception_aborts_the_multipart_upload(emulator: Emulator, store: Any) -> None:
    checkpoint = checkpoint_for(store)
    uri = f"gs://{store.bucket}/last.pt"
    checkpoint.save(state(1), uri)
    with pytest.raises(KeyError), checkpoint.writer(uri) as f:
        torch.save(state(2), f)
        raise KeyError("optimizer state missing")
    assert stored_names(emulator, store.bucket) == ["last.pt"]
    assert runtime.run(store.multipart_list()) == []
    assert_same(checkpoint.load(uri, weights_only=True), state(1))


def test_transient_part_failures_are_retried(emulator: Emulator, store: Any) -> None:
    checkpoint = checkpoint_for(store)
    name = f"flaky-{uuid.uuid4().hex[:8]}.pt"
    emulator.add_fault("mpu_part", "503", count=2, match=name)
    emulator.add_fault("mpu_part", "reset", nth=3, match=name)
    uri = f"gs://{store.bucket}/{name}"
    checkpoint.save(state(3), uri)
    assert sum(rule["fired"] for rule in emulator.faults()) == 3
    assert_same(checkpoint.load(uri, weights_only=True), state(3))
    assert runtime.run(store.multipart_list()) == []


def test_a_refused_part_fails_the_save_and_leaves_nothing(emulator: Emulator, store: Any) -> None:
    checkpoint = checkpoint_for(store)
    name = f"denied-{uuid.uuid4().hex[:8]}.pt"
    emulator.add_fault("mpu_part", "403", nth=2, match=name)
    uri = f"gs://{store.bucket}/{name}"
    with pytest.raises(PermissionDeniedError) as info:
        checkpoint.save(state(4), uri)
    assert store.bucket in str(info.value)
    assert stored_names(emulator, store.bucket) == []
    assert runtime.run(store.multipart_list()) == []


def test_corrupt_ranged_read_is_retried(emulator: Emulator, store: Any) -> None:
    checkpoint = checkpoint_for(store)
    name = f"c-{uuid.uuid4().hex[:8]}.pt"
    uri = f"gs://{store.bucket}/{name}"
    checkpoint.save(state(5), uri)
    emulator.add_fault("get", "corrupt", nth=2, match=name)
    emulator.add_fault("get", "truncate", nth=4, match=name)
    assert_same(checkpoint.load(uri, weights_only=True), state(5))
    assert sum(rule["fired"] for rule in emulator.faults()) == 2


def test_missing_checkpoint_names_the_uri(store: Any) -> None:
    uri = f"gs://{store.bucket}/nothing-{uuid.uuid4().hex[:6]}.pt"
    with pytest.raises(NotFoundError, match=uri):
        checkpoint_for(store).reader(uri)


def test_cleanup_aborts_orphaned_uploads(store: Any) -> None:
    async def orphan_then_cleanup() -> tuple[int, int, int]:
        await store.multipart_initiate("run/a.pt")
        await store.multipart_initiate("other/b.pt")
        young = await abort_incomplete_uploads(store, "run/", older_than=3600)
        aborted = await abort_incomplete_uploads(store, "run/")
        return young, aborted, len(await store.multipart_list())

    assert runtime.run(orphan_then_cleanup()) == (0, 1, 1)
