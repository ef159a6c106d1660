"""``BucketCheckpoint.load``'s mapped path over HTTP (issue 45): bad bytes still fail the load.

The default load downloads into a memfd that ``torch.load(..., mmap=True)``
maps. A checkpoint whose bytes in the bucket are not the object's (every read
of it corrupt) fails with an ``IntegrityError`` naming it, after a second
whole read; one rewritten by another writer while it loads fails with a
``NotFoundError`` saying so, instead of mixing two checkpoints' bytes.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.config import HedgeConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError, NotFoundError

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd: Linux"),
]

PART = 64 * 1024
CONFIG = CheckpointConfig(part_size=PART, min_part_size=1, range_size=PART, reads_in_flight=1)


@pytest.fixture
def store(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="mapped")


def state(seed: int) -> dict[str, Any]:
    return {"w": torch.randn(256, 256, generator=torch.Generator().manual_seed(seed))}


def test_a_checkpoint_corrupt_in_the_bucket_fails_the_load_naming_it(
    emulator: Emulator, store: Any
) -> None:
    checkpoint = BucketCheckpoint(config=CONFIG, gcs=store.config)
    name = f"rot-{uuid.uuid4().hex[:8]}.pt"
    uri = f"gs://{store.bucket}/{name}"
    checkpoint.save(state(1), uri)
    emulator.add_fault("get", "corrupt", nth=1, count=None, match=name)
    with pytest.raises(IntegrityError, match="crc32c") as info:
        checkpoint.load(uri, weights_only=True)
    assert uri in str(info.value)


def test_a_checkpoint_rewritten_during_the_load_fails_it(emulator: Emulator, store: Any) -> None:
    # No hedge of the held range and no timeout shorter than the hold: the
    # range is read again only after the rewrite has landed.
    gcs = dataclasses.replace(
        store.config,
        hedge=HedgeConfig(enabled=False),
        retry=dataclasses.replace(store.config.retry, read_timeout=30.0, attempt_timeout=30.0),
    )
    checkpoint = BucketCheckpoint(config=CONFIG, gcs=gcs)
    name = f"moving-{uuid.uuid4().hex[:8]}.pt"
    uri = f"gs://{store.bucket}/{name}"
    checkpoint.save(state(1), uri)
    # The second range is held (then its connection reset); while it is held
    # another writer saves a new checkpoint there, and the range read again
    # finds its generation gone.
    emulator.add_fault("get", "stall", nth=2, match=name, stall_seconds=8.0)
    gets_before = emulator.stats()["by_op"].get("get", 0)

    def rewrite() -> None:
        deadline = time.monotonic() + 30
        while emulator.stats()["by_op"].get("get", 0) < gets_before + 2:
            assert time.monotonic() < deadline, "the load never reached its second range"
            time.sleep(0.05)
        BucketCheckpoint(config=CONFIG, gcs=store.config).save(state(2), uri)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        with pytest.raises(NotFoundError, match="rewritten") as info:
            checkpoint.load(uri, weights_only=True)
    finally:
        writer.join()
    assert uri in str(info.value)
    assert torch.equal(checkpoint.load(uri, weights_only=True)["w"], state(2)["w"])
