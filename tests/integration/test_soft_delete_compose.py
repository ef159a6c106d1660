"""Compose is off by default on a bucket with soft delete on, over HTTP (model store)."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from torch.utils.data import DataLoader

from torchbucket.compose import ComposeConfig, _softdelete
from torchbucket.config import HedgeConfig
from torchbucket.datasets import BucketIterableDataset
from torchbucket.emulator import Emulator
from torchbucket.storage import gcs as gcs_module
from torchbucket.storage.gcs import GCSConfig
from torchbucket.storage.gcs import _bucket as gcs_bucket

pytestmark = pytest.mark.emulator

WEEK = 7 * 86400


@pytest.fixture(autouse=True)
def _fresh_policy_cache() -> None:
    # Each test makes new buckets; these caches are per process by design.
    _softdelete._retention.clear()
    _softdelete._told.clear()
    gcs_bucket._soft_delete_cache.clear()


def _bucket(emu: Emulator, soft_delete_seconds: int) -> str:
    name = f"sd-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, soft_delete_seconds=soft_delete_seconds)
    emu.seed(name, {f"d/{i:03d}": bytes([i]) * 100 for i in range(96)})
    return name


def _epoch(emu: Emulator, bucket: str, compose: ComposeConfig | None = None) -> dict[str, int]:
    # No hedged reads: the test counts GETs exactly (a slow read would be hedged).
    config = GCSConfig(endpoint=emu.endpoint, anonymous=True, hedge=HedgeConfig(enabled=False))
    emu.reset_stats()  # the dataset reads the policy as it is built
    ds = BucketIterableDataset.from_prefix(f"gs://{bucket}/d/", gcs=config, compose=compose)
    data = list(ds)
    assert sorted(data) == sorted(bytes([i]) * 100 for i in range(96))
    return {op: n for op, n in emu.stats()["by_op"].items() if n}


def test_soft_delete_on_turns_compose_off_with_one_info_line(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = _bucket(emulator, WEEK)
    with caplog.at_level(logging.INFO, logger="torchbucket.compose._softdelete"):
        ops = _epoch(emulator, bucket)
        again = _epoch(emulator, bucket)
    assert "compose" not in ops and "delete" not in ops
    assert ops["get"] == 96
    assert ops["bucket_get"] == 1  # the policy, read once per process
    assert "bucket_get" not in again
    lines = [r.getMessage() for r in caplog.records if "soft delete" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"gs://{bucket}" in lines[0] and "allow_with_soft_delete=True" in lines[0]


@pytest.mark.parametrize("soft_delete_seconds", [WEEK, 0])
def test_forked_workers_inherit_the_policy_read_when_the_dataset_was_built(
    emulator: Emulator, soft_delete_seconds: int
) -> None:
    # Workers that are not persistent are new processes each epoch; they used
    # to read the policy each (a buckets.get per worker per epoch, before
    # their first compose).
    bucket = _bucket(emulator, soft_delete_seconds)
    config = GCSConfig(endpoint=emulator.endpoint, anonymous=True)
    emulator.reset_stats()
    ds = BucketIterableDataset.from_prefix(f"gs://{bucket}/d/", gcs=config)
    assert emulator.stats()["by_op"].get("bucket_get") == 1
    loader = DataLoader(
        ds, batch_size=16, num_workers=2, multiprocessing_context="fork", collate_fn=list
    )
    for _ in range(2):
        assert sorted(b for batch in loader for b in batch) == sorted(
            bytes([i]) * 100 for i in range(96)
        )
    ops = emulator.stats()["by_op"]
    assert ops.get("bucket_get") == 1
    assert (ops.get("compose", 0) > 0) is (soft_delete_seconds == 0)


def test_soft_delete_off_composes(emulator: Emulator) -> None:
    ops = _epoch(emulator, _bucket(emulator, 0))
    assert ops.get("compose", 0) > 0
    assert ops["bucket_get"] == 1


def test_opt_in_composes_on_a_soft_delete_bucket(emulator: Emulator) -> None:
    bucket = _bucket(emulator, WEEK)
    ops = _epoch(emulator, bucket, ComposeConfig(allow_with_soft_delete=True))
    assert ops.get("compose", 0) > 0
    assert "bucket_get" not in ops  # opted in: the policy is not even asked


def test_policy_set_after_create_is_seen_by_a_new_process(emulator: Emulator) -> None:
    bucket = _bucket(emulator, 0)
    emulator.set_soft_delete(bucket, 30 * 86400)
    ops = _epoch(emulator, bucket)
    assert "compose" not in ops


def test_unreadable_policy_is_unknown_and_compose_goes_ahead(emulator: Emulator) -> None:
    bucket = _bucket(emulator, WEEK)
    emulator.add_fault("bucket_get", "403", count=None)
    ops = _epoch(emulator, bucket)
    assert ops.get("compose", 0) > 0
    assert _softdelete.known_retention(_store(emulator, bucket)) is None


def _store(emu: Emulator, bucket: str) -> gcs_module.GCSStore:
    return gcs_module.GCSStore(bucket, config=GCSConfig(endpoint=emu.endpoint, anonymous=True))


def test_emulator_refuses_a_retention_gcs_refuses(emulator: Emulator) -> None:
    from torchbucket.errors import ConfigError

    with pytest.raises(ConfigError, match="604800"):
        emulator.create_bucket(f"sd-{uuid.uuid4().hex[:12]}", soft_delete_seconds=3600)


def test_json_api_bucket_insert_sets_the_policy(emulator: Emulator, raw_http: Any) -> None:
    name = f"sd-{uuid.uuid4().hex[:12]}"
    body = {"name": name, "softDeletePolicy": {"retentionDurationSeconds": str(WEEK)}}
    created = raw_http(emulator, "POST", "/storage/v1/b?project=p", json.dumps(body).encode())
    assert created.status == 200, created.body
    got = raw_http(emulator, "GET", f"/storage/v1/b/{name}").json()
    assert got["softDeletePolicy"]["retentionDurationSeconds"] == str(WEEK)
    plain = f"sd-{uuid.uuid4().hex[:12]}"
    raw_http(emulator, "POST", "/storage/v1/b?project=p", json.dumps({"name": plain}).encode())
    got = raw_http(emulator, "GET", f"/storage/v1/b/{plain}").json()
    assert got["softDeletePolicy"] == {"retentionDurationSeconds": "0"}
    bad = {
        "name": f"sd-{uuid.uuid4().hex[:12]}",
        "softDeletePolicy": {"retentionDurationSeconds": "60"},
    }
    assert raw_http(emulator, "POST", "/storage/v1/b", json.dumps(bad).encode()).status == 400
