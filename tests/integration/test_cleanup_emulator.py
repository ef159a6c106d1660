"""`torchbucket cleanup` where the multipart API is missing, over HTTP.

The bucket's existence is decided by a bucket request; an endpoint that answers
the multipart listing 404, 405 or 501 (no XML multipart API) loses only the
uploads half of the cleanup, with one warning.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.cli import main
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

COMPOSED = "dataflux-composed-objects/"


def run(emulator: Emulator, *argv: str) -> int:
    return main(["--endpoint", emulator.endpoint, "--deadline", "20", *argv])


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    store = gcs_bucket_factory(emulator, prefix="clean")

    async def leave_leftovers() -> None:
        await store.put(f"{COMPOSED}a", b"1" * 100)
        await store.put(f"{COMPOSED}b", b"2" * 100)
        await store.put("data/keep", b"k")

    runtime.run(leave_leftovers())
    return store


@pytest.mark.parametrize("status", ["404", "405", "501"])
def test_a_missing_multipart_api_skips_only_the_uploads(
    emulator: Emulator,
    bucket: Any,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    status: str,
) -> None:
    uri = f"gs://{bucket.bucket}/"
    emulator.add_fault("mpu_list", status, count=None)

    with caplog.at_level(logging.WARNING):
        assert run(emulator, "cleanup", "--dry-run", uri) == 0
    out = capsys.readouterr().out
    assert f"would remove composed object {uri}{COMPOSED}a" in out
    assert f"would remove composed object {uri}{COMPOSED}b" in out
    assert (
        f"dry run: 2 composed objects would be removed from {uri}; incomplete uploads not "
        f"checked: no multipart upload API (HTTP {status})"
    ) in out
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no multipart upload API" in warnings[0], warnings
    assert not [r for r in caplog.records if r.exc_info]
    assert len(emulator.object_names(bucket.bucket, COMPOSED)) == 2  # a dry run

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert run(emulator, "cleanup", uri) == 0
    out = capsys.readouterr().out
    assert f"removed 2 composed objects in {uri}; incomplete uploads not checked" in out
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert emulator.object_names(bucket.bucket) == ["data/keep"]


def test_the_bucket_request_decides_that_a_bucket_is_missing(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    emulator.reset_stats()
    assert run(emulator, "cleanup", f"gs://{missing}/") == 3
    err = capsys.readouterr().err
    assert f"cleanup gs://{missing}/: bucket does not exist" in err
    by_op = emulator.stats()["by_op"]
    assert by_op.get("bucket_get") == 1
    assert "mpu_list" not in by_op and "list" not in by_op


def test_a_bucket_whose_metadata_is_forbidden_is_still_cleaned(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Object roles lack storage.buckets.get: a 403 there says nothing about existence."""
    uri = f"gs://{bucket.bucket}/"
    emulator.add_fault("bucket_get", "403", count=None)
    upload_id = runtime.run(bucket.multipart_initiate("ckpt/e.pt"))
    assert run(emulator, "cleanup", uri) == 0
    out = capsys.readouterr().out
    assert "removed 2 composed objects and aborted 1 incomplete upload" in out, upload_id
    assert emulator.object_names(bucket.bucket) == ["data/keep"]
    assert runtime.run(bucket.multipart_list()) == []


def test_a_forbidden_upload_listing_is_still_an_error(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """403 is a refusal, not a missing API: reported (exit 4), nothing removed."""
    emulator.add_fault("mpu_list", "403", count=None)
    assert run(emulator, "cleanup", f"gs://{bucket.bucket}/") == 4
    assert "multipart list" in capsys.readouterr().err
    assert len(emulator.object_names(bucket.bucket, COMPOSED)) == 2
