"""The retry table, status by status, over HTTP against the emulator.

Google's retry strategy for Cloud Storage
(https://cloud.google.com/storage/docs/retry-strategy) retries 408, 429 and
the 5xx that google-cloud-storage retries (500, 502, 503, 504), plus resets and
timeouts; any other answer is final. The emulator answers the chosen status for
the first requests of an operation; what the user sees, and how many requests
reached the server, tell whether it was retried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.config import HedgeConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import (
    NotFoundError,
    PermissionDeniedError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.storage.gcs._errors import STATUS_ERRORS

pytestmark = pytest.mark.emulator

DATA = b"retry table " * 100

RETRIED = {408: TransientError, 429: ThrottledError, 500: TransientError}
RETRIED |= {502: TransientError, 503: ThrottledError, 504: TransientError}
FINAL = {403: PermissionDeniedError, 404: NotFoundError, 405: StorageError, 501: StorageError}
NO_HEDGE = HedgeConfig(enabled=False)


def test_the_table_is_googles_list() -> None:
    retried = {
        s for s, t in STATUS_ERRORS.items() if issubclass(t, (TransientError, ThrottledError))
    }
    assert retried == {408, 429, 500, 502, 503, 504}
    assert 501 not in STATUS_ERRORS  # a plain, final StorageError


@pytest.mark.parametrize("status", sorted(RETRIED))
def test_a_retried_status_is_ridden_out(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], status: int
) -> None:
    # No hedged reads: the test counts the GETs that reached the server.
    store = gcs_bucket_factory(emulator, hedge=NO_HEDGE)
    runtime.run(store.put("obj", DATA))
    emulator.reset_stats()
    emulator.add_fault("get", str(status), count=2, match="obj")
    assert runtime.run(store.get("obj")) == DATA
    assert emulator.stats()["by_op"]["get"] == 3  # two answers of `status`, then the data


@pytest.mark.parametrize("status", sorted(FINAL))
def test_any_other_status_is_final_at_once(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], status: int
) -> None:
    # No hedged reads: the test counts the GETs that reached the server.
    store = gcs_bucket_factory(emulator, hedge=NO_HEDGE)
    runtime.run(store.put("obj", DATA))
    emulator.reset_stats()
    emulator.add_fault("get", str(status), count=None, match="obj")
    with pytest.raises(FINAL[status]) as caught:
        runtime.run(store.get("obj"))
    assert emulator.stats()["by_op"]["get"] == 1
    error = caught.value
    assert error.status == status
    text = str(error)
    assert text.startswith(f"get {store.uri('obj')}: ")
    assert text.count(f"(HTTP {status})") == 1 and text.endswith(f"(HTTP {status})")


@pytest.mark.parametrize("status", [500, 501])
def test_a_listing_follows_the_same_table(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], status: int
) -> None:
    store = gcs_bucket_factory(emulator)
    runtime.run(store.put("a/obj", DATA))
    emulator.reset_stats()
    emulator.add_fault("list", str(status), count=1)
    if status in RETRIED:
        page = runtime.run(store.list_page("a/"))
        assert [o.name for o in page.objects] == ["a/obj"]
        assert emulator.stats()["by_op"]["list"] == 2
    else:
        with pytest.raises(StorageError) as caught:
            runtime.run(store.list_page("a/"))
        assert caught.value.status == status
        assert emulator.stats()["by_op"]["list"] == 1


def test_a_multipart_initiate_answered_501_is_not_retried(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    """The issue's case: 44 requests over 296 s before; one request now."""
    store = gcs_bucket_factory(emulator)
    emulator.reset_stats()
    emulator.add_fault("mpu_initiate", "501", count=None)
    with pytest.raises(StorageError) as caught:
        runtime.run(store.multipart_initiate("ck/c.pt"))
    assert not isinstance(caught.value, (TransientError, ThrottledError))
    assert caught.value.status == 501
    assert emulator.stats()["by_op"]["mpu_initiate"] == 1


def test_a_408_on_a_resumable_chunk_resumes_the_session(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    """A 408 mid-upload: the session is asked what it holds, then the rest is sent."""
    store = gcs_bucket_factory(emulator, max_simple_upload_size=0, upload_chunk_size=256 * 1024)
    data = bytes(range(256)) * 4096  # 1 MiB: four chunks
    emulator.reset_stats()
    emulator.add_fault("resumable", "408", nth=3, count=1)
    info = runtime.run(store.put("big", data))
    assert info.size == len(data)
    assert runtime.run(store.get("big")) == data


def test_an_error_after_retries_reads_once(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    """Operation, URI and status appear once each, the cause's message with them."""
    from torchbucket.config import RetryConfig
    from torchbucket.errors import DeadlineExceededError

    retry = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=0.5)
    store = gcs_bucket_factory(emulator, retry=retry)
    runtime.run(store.put("obj", DATA))
    emulator.add_fault("get", "503", count=None, match="obj")
    with pytest.raises(DeadlineExceededError) as caught:
        runtime.run(store.get("obj"))
    text = str(caught.value)
    uri = store.uri("obj")
    # Which of the two the deadline gives depends on timing: the retry loop
    # gave up between attempts, or the deadline cut an attempt short (on a
    # loaded machine a try can take the rest of the 0.5 s). Both name the
    # last error's cause.
    assert text.startswith((f"get {uri}: gave up after ", f"get {uri}: no answer before "))
    assert text.count(uri) == 1
    assert text.count("HTTP 503") == 1 and text.endswith("(HTTP 503)")
    assert "ThrottledError: Service unavailable (injected fault)." in text
