"""A refused endpoint fails in seconds, naming it; GCS's own faults keep their retries.

After the emulator restarts (on a new random port) the old address in
``STORAGE_EMULATOR_HOST`` refuses every connection. That used to be retried as
a transient fault until the five-minute deadline (291 s of silence for
``torchbucket ls``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import BucketMapDataset, runtime
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import TransientError, UnreachableError
from torchbucket.runtime import retry
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator


def closed_port() -> int:
    """A loopback port nobody listens on (it refuses connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ls_on_a_stale_emulator_address_fails_in_seconds_and_says_why() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint}
    env.pop("TORCHBUCKET_GCS_ANONYMOUS", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "torchbucket", "ls", "gs://my-bucket/train/"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # the old behaviour: 300 s
    )
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert took < 10, f"took {took:.1f} s"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("torchbucket: error: list gs://my-bucket/train/")
    assert f"cannot connect to {endpoint}: connection refused" in lines[0]
    assert "is the emulator running?" in lines[0]


def test_a_dataset_on_a_refused_endpoint_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    started = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        BucketMapDataset.from_prefix("gs://my-bucket/train/")
    assert time.monotonic() - started < 10
    assert endpoint in str(info.value)
    assert "is the emulator running?" in str(info.value)
    assert isinstance(info.value, TransientError)  # still caught where transient faults are


def test_a_refused_endpoint_without_the_emulator_variable_names_it_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    endpoint = f"http://localhost:{closed_port()}"
    store = GCSStore("my-bucket", config=GCSConfig(endpoint=endpoint))
    try:
        with pytest.raises(UnreachableError) as info:
            runtime.run(store.head("x"))
    finally:
        runtime.run(store.close())
    assert f"cannot connect to {endpoint}" in str(info.value)
    assert "emulator" not in str(info.value)


def test_resets_and_503s_from_the_emulator_are_still_retried(
    emulator: Emulator,
    gcs_bucket_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Even with no grace at all for refused connections, the server's own
    # transient failures keep the retry deadline.
    monkeypatch.setattr(retry, "UNREACHABLE_GIVE_UP_S", 0.0)
    store = gcs_bucket_factory(
        emulator, retry=RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=60.0)
    )
    runtime.run(store.put("train/a", b"abc"))
    emulator.add_fault("get", "reset", count=3)
    emulator.add_fault("get", "503", nth=4, count=3)
    assert runtime.run(store.get("train/a")) == b"abc"
    assert sum(rule["fired"] for rule in emulator.faults()) == 6
