"""Persistent DataLoader workers with compose on end quietly when the script ends.

The README's iterable snippet (and map-style with ``BucketBatchSampler``), run
as a user runs it: a script that iterates and exits. At exit multiprocessing
ends the persistent workers with SIGTERM; compose's handler there used to
re-raise the signal, so the script ended printing ``Exception ignored in
atexit callback ... DataLoader worker (pid ...) is killed by signal:
Terminated.`` The workers must exit quietly and still delete their composites.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

COMPOSED = "dataflux-composed-objects/"

ITERABLE = """
import sys
import torch
from torch.utils.data import DataLoader
from torchbucket import BucketIterableDataset, FetchConfig

train = BucketIterableDataset.from_prefix(
    sys.argv[1],
    data_format_fn=lambda data: torch.tensor(len(data)),
    shuffle=True, seed=17,
    fetch=FetchConfig(reads_in_flight=128),
)
loader = DataLoader(train, batch_size=16, num_workers=4, persistent_workers=True)
for epoch in range(2):
    train.set_epoch(epoch)
    for i, batch in enumerate(loader):
        if epoch == 1 and i == 2:
            break   # leave the second epoch with reads and composites in flight
print("DONE")
"""

MAP_BATCH_SAMPLER = """
import sys
import torch
from torch.utils.data import DataLoader
from torchbucket import BucketBatchSampler, BucketMapDataset

train = BucketMapDataset.from_prefix(sys.argv[1], data_format_fn=lambda data: torch.tensor(len(data)))
sampler = BucketBatchSampler(train, batch_size=16, seed=17)
loader = DataLoader(train, batch_sampler=sampler, num_workers=4, persistent_workers=True)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for i, batch in enumerate(loader):
        if epoch == 1 and i == 2:
            break
print("DONE")
"""


@pytest.mark.parametrize(
    "source", [ITERABLE, MAP_BATCH_SAMPLER], ids=["iterable", "map-batch-sampler"]
)
def test_persistent_workers_with_compose_exit_without_a_traceback(
    emulator: Emulator, tmp_path: os.PathLike[str], source: str, bucket_kind: str
) -> None:
    bucket = f"exit-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(bucket)
    emulator.seed(bucket, {f"train/{i:04d}.bin": os.urandom(1000 + i) for i in range(400)})
    script = os.path.join(tmp_path, "snippet.py")
    with open(script, "w") as f:
        f.write(source)
    emulator.reset_stats()
    result = subprocess.run(
        [sys.executable, "-W", "ignore", script, f"gs://{bucket}/train/"],
        env={**os.environ, "STORAGE_EMULATOR_HOST": emulator.endpoint},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["DONE"]
    for needle in ("Traceback", "Exception ignored", "killed by signal"):
        assert needle not in result.stderr, result.stderr
    # Compose was on (the snippets' default): composites were made, and none is
    # left; a zonal bucket has no compose, and none was asked.
    composes = emulator.stats()["by_bucket"][bucket]["by_op"].get("compose", 0)
    assert composes > 0 if bucket_kind == "regional" else composes == 0
    assert emulator.object_names(bucket, COMPOSED) == []
