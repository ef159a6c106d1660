"""A DataLoader worker whose main process is killed stops, even while its reads hang.

torch's worker loop looks for a dead main process only between tasks. A
worker whose task waits on a bucket that does not answer (a read retried up to
the retry deadline, minutes) must not go on reading for nobody: it notices
within about :data:`torchbucket.runtime.PARENT_CHECK_S` and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

_SCRIPT = """
import sys, time
from torch.utils.data import DataLoader
from torchbucket.compose import ComposeConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, collate_list
from torchbucket.storage.gcs import GCSConfig

bucket, endpoint = sys.argv[1:]
# Retries that outlast the test: the reads' stall is never abandoned.
retry = RetryConfig(deadline=600.0, attempt_timeout=300.0, read_timeout=300.0)
gcs = GCSConfig(endpoint=endpoint, anonymous=True, retry=retry)
iterators = [
    iter(DataLoader(
        kind.from_prefix(f"gs://{bucket}/{prefix}/", gcs=gcs, compose=ComposeConfig(enabled=False)),
        batch_size=2, num_workers=1, multiprocessing_context="fork", collate_fn=collate_list,
    ))
    for kind, prefix in ((BucketMapDataset, "map"), (BucketIterableDataset, "iterable"))
]
# Each worker starts on its first batch as its iterator is made; every read stalls.
print(*(it._workers[0].pid for it in iterators), flush=True)
time.sleep(3600)
"""

#: Longer than the wait below: a worker still there at its end is waiting on it.
STALL_S = 120.0
#: How long a worker has to exit once its main process is gone.
EXIT_WITHIN_S = 30.0
STYLES = ("map", "iterable")


def test_workers_exit_when_their_main_process_is_killed_mid_read(
    emulator: Emulator, tmp_path: Path
) -> None:
    name = f"orphan-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"{s}/{i:02d}": bytes([i]) * 1000 for s in STYLES for i in range(8)})
    for style in STYLES:
        emulator.add_fault("get", "stall", match=f"{style}/", count=None, stall_seconds=STALL_S)
    script = tmp_path / "orphan.py"
    script.write_text(_SCRIPT)
    main = subprocess.Popen(
        [sys.executable, str(script), name, emulator.endpoint], stdout=subprocess.PIPE, text=True
    )
    workers: list[psutil.Process] = []
    try:
        assert main.stdout is not None
        workers = [psutil.Process(int(pid)) for pid in main.stdout.readline().split()]
        assert len(workers) == len(STYLES)
        deadline = time.monotonic() + 60
        while not all(rule["fired"] for rule in emulator.faults()):
            assert time.monotonic() < deadline, f"a worker never sent a read: {emulator.faults()}"
            time.sleep(0.05)
        main.send_signal(signal.SIGKILL)
        main.wait(timeout=30)
        gone_by = time.monotonic() + EXIT_WITHIN_S
        for style, worker in zip(STYLES, workers):
            while _alive(worker):
                assert time.monotonic() < gone_by, (
                    f"the {style} worker {worker.pid} still runs {EXIT_WITHIN_S:g} s "
                    "after its main process"
                )
                time.sleep(0.1)
    finally:
        emulator.clear_faults()
        if main.poll() is None:
            main.kill()
            main.wait()
        for worker in workers:
            if _alive(worker):
                os.kill(worker.pid, signal.SIGKILL)


def _alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (an exited orphan may stay a zombie until reaped)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
