"""A save killed with SIGKILL leaves the previous checkpoint whole and nothing new visible."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bucket_kinds import stored_names
from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

SAVER = Path(__file__).with_name("_crash_saver.py")


def test_sigkill_mid_save_keeps_previous_checkpoint(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator, prefix="crash")
    uri = f"gs://{store.bucket}/run/last.pt"
    checkpoint = BucketCheckpoint(
        config=CheckpointConfig(part_size=64 * 1024, min_part_size=1), gcs=store.config
    )
    previous = {"w": torch.randn(300, 300), "step": 100}
    checkpoint.save(previous, uri)
    with checkpoint.reader(uri) as f:
        generation = f.info.generation

    child = subprocess.Popen(
        [sys.executable, str(SAVER), emulator.endpoint, uri],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "UPLOADING", child.stderr.read() if child.stderr else ""
        # Parts are on the server: the upload exists, unfinished.
        deadline = time.monotonic() + 30
        while not runtime.run(store.multipart_list("run/")):
            assert time.monotonic() < deadline, "the child's multipart upload never appeared"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert child.returncode == -signal.SIGKILL

    # The previous checkpoint is intact and the only object there.
    assert stored_names(emulator, store.bucket) == ["run/last.pt"]
    with checkpoint.reader(uri) as f:
        assert f.info.generation == generation
        loaded = torch.load(f, weights_only=True)
    assert torch.equal(loaded["w"], previous["w"]) and loaded["step"] == 100

    # The orphaned upload (to the checkpoint's hidden staging name, where a
    # multipart save is assembled and checked before it takes the checkpoint's
    # name) is there until `torchbucket cleanup` aborts it.
    orphans = runtime.run(store.multipart_list("run/"))
    assert [u.key.startswith("run/.last.pt.tbtmp-") for u in orphans] == [True]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchbucket",
            "cleanup",
            "--endpoint",
            emulator.endpoint,
            f"gs://{store.bucket}/run/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert runtime.run(store.multipart_list()) == []
    assert stored_names(emulator, store.bucket) == ["run/last.pt"]
