"""Crash tests: a dataset epoch and a checkpoint save killed mid-way.

Each workload runs as its own process (``_crash_epoch.py``, ``_crash_save.py``)
against the emulator with same-region latency. A fault rule holds a request
(a composite's delete, a checkpoint part) so that the kill lands while
composites exist or parts are uploading: the test waits for the script's
marker and for the emulator to report the held request, never for a guessed
time. Afterwards:

- SIGKILL leaves composites or an incomplete upload; ``torchbucket cleanup``
  (or the cleanup functions) removes them, and the next run works.
- SIGTERM of a process holding composites (main process or DataLoader worker)
  lets the compose registry delete them: nothing is left, no cleanup run.
- A killed save never damages the previous checkpoint under the same name.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _workloads import Bucket, payload, same_state, state

from torchbucket import runtime
from torchbucket.checkpoint import abort_incomplete_uploads
from torchbucket.compose import cleanup_composites

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

HERE = Path(__file__).parent
N = 200
HOLD = 60.0  # a held request outlasts the test


def start(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 60.0) -> str:
    """The first line of the process's output that starts with ``prefix``."""
    assert proc.stdout is not None
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < end:
            if not sel.select(timeout=0.5):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line.strip()
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"no {prefix!r} line from the script; stderr:\n{err[-3000:]}")


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting until {what}")


def held(bucket: Bucket, count: int) -> Callable[[], bool]:
    """Whether the emulator holds ``count`` requests of the fault rule now."""
    return lambda: sum(r["fired"] for r in bucket.emu.faults()) >= count


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def run_to_end(script: str, *args: str) -> str:
    proc = start(script, *args)
    code, out, err = finish(proc)
    assert code == 0, f"exit {code}\n{out}\n{err[-3000:]}"
    return out


def expected_digest() -> str:
    h = hashlib.sha256()
    for sample in sorted(payload(i) for i in range(N)):
        h.update(len(sample).to_bytes(8, "big"))
        h.update(sample)
    return h.hexdigest()[:16]


def cli_cleanup(bucket: Bucket, prefix: str = "") -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchbucket",
            "cleanup",
            "--endpoint",
            bucket.emu.endpoint,
            bucket.uri(prefix),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def epoch_bucket(model_bucket: Bucket) -> Bucket:
    model_bucket.seed_dataset(N)
    return model_bucket


def hold_composites(bucket: Bucket) -> None:
    """Latency as in a region, and the first two composite deletes held."""
    bucket.emu.set_latency("same-region")
    bucket.emu.add_fault("delete", "stall", count=2, stall_seconds=HOLD)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_main_process_killed_mid_epoch(epoch_bucket: Bucket, sig: signal.Signals) -> None:
    bucket = epoch_bucket
    hold_composites(bucket)
    proc = start("_crash_epoch.py", bucket.emu.endpoint, bucket.name, "--workers", "0")
    read_until(proc, "COMPOSING")
    wait_until(held(bucket, 2), "both composite deletes of the first batch are held")
    assert len(bucket.composites()) == 2
    proc.send_signal(sig)
    code, _, err = finish(proc)
    assert code == -sig, err[-3000:]
    bucket.emu.clear_faults()
    bucket.emu.set_latency(None)
    if sig == signal.SIGTERM:
        # The registry's SIGTERM handler deleted them before the process ended.
        assert bucket.composites() == []
    else:
        assert len(bucket.composites()) == 2
        out = cli_cleanup(bucket)
        assert "removed 2 composed objects" in out
        assert bucket.composites() == []
        # The next run reads every object, exactly, and leaves nothing.
        done = run_to_end("_crash_epoch.py", bucket.emu.endpoint, bucket.name).split()
        assert done[-3:] == ["DONE", str(N), expected_digest()]
        assert bucket.composites() == []
    assert len(bucket.emu.object_names(bucket.name, "d/")) == N


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_dataloader_worker_killed_mid_epoch(epoch_bucket: Bucket, sig: signal.Signals) -> None:
    bucket = epoch_bucket
    hold_composites(bucket)
    proc = start("_crash_epoch.py", bucket.emu.endpoint, bucket.name, "--workers", "1")
    pid = int(read_until(proc, "WORKERS").split()[1])
    wait_until(held(bucket, 2), "both composite deletes of the worker's batch are held")
    assert len(bucket.composites()) == 2
    os.kill(pid, sig)
    code, out, err = finish(proc)
    # The DataLoader reports the dead worker; the epoch fails loudly, not silently short.
    assert code == 3, f"{out}\n{err[-3000:]}"
    assert "DataLoader worker" in out and str(pid) in out
    bucket.emu.clear_faults()
    bucket.emu.set_latency(None)
    if sig == signal.SIGTERM:
        assert bucket.composites() == []
    else:
        assert len(bucket.composites()) == 2
        store = bucket.store()
        try:
            assert runtime.run(cleanup_composites(store)) == 2
        finally:
            runtime.run(store.close())
        assert bucket.composites() == []
    assert len(bucket.emu.object_names(bucket.name, "d/")) == N


SAVE_CASES = [
    pytest.param("multipart", signal.SIGKILL, id="multipart-SIGKILL"),
    pytest.param("multipart", signal.SIGTERM, id="multipart-SIGTERM"),
    pytest.param("resumable", signal.SIGKILL, id="resumable-SIGKILL"),
]


@pytest.mark.parametrize(("method", "sig"), SAVE_CASES)
def test_save_killed_midway_keeps_the_previous_checkpoint(
    model_bucket: Bucket, method: str, sig: signal.Signals
) -> None:
    bucket = model_bucket
    key = "run/last.pt"
    uri = bucket.uri(key)
    good = bucket.checkpoint()
    good.save(state(1), uri)
    bucket.emu.set_latency("same-region")
    # Two parts (or the session start and a chunk) go through; the next is held.
    op = "mpu_part" if method == "multipart" else "resumable"
    bucket.emu.add_fault(op, "stall", nth=3, count=None, stall_seconds=HOLD)
    proc = start("_crash_save.py", bucket.emu.endpoint, bucket.name, key, "2", "--method", method)
    read_until(proc, "MID-SAVE")
    wait_until(held(bucket, 1), "an upload request is held")
    proc.send_signal(sig)
    code, _, err = finish(proc)
    assert code == -sig, err[-3000:]
    bucket.emu.clear_faults()
    bucket.emu.set_latency(None)

    assert same_state(good.load(uri, weights_only=True), state(1))
    # A multipart save uploads to a hidden staging name next to the checkpoint
    # (it is checked there before it takes the checkpoint's name).
    staged = "run/.last.pt.tbtmp-"
    left = bucket.incomplete_uploads()
    assert [k.startswith(staged) for k in left] == ([True] if method == "multipart" else [])

    # The next run saves over it; the dead save's upload stays until cleanup
    # (a save aborts only uploads older than CheckpointConfig.stale_upload_age).
    out = run_to_end(
        "_crash_save.py", bucket.emu.endpoint, bucket.name, key, "3", "--method", method
    )
    assert out.strip().endswith("SAVED")
    assert same_state(good.load(uri, weights_only=True), state(3))
    if method == "multipart":
        assert bucket.incomplete_uploads() == left
        if sig == signal.SIGKILL:
            assert "aborted 1 incomplete upload" in cli_cleanup(bucket, "run/")
        else:
            store = bucket.store()
            try:
                assert runtime.run(abort_incomplete_uploads(store, "run/")) == 1
            finally:
                runtime.run(store.close())
    assert bucket.incomplete_uploads() == []
    assert same_state(good.load(uri, weights_only=True), state(3))
