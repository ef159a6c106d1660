"""The job's request budget on a zonal bucket: gRPC write streams spend from it as JSON requests do.

A streamed write over ``BidiWriteObject`` is one write request to GCS per
stream opened; with the budget on, each stream (the first, and each one
reopened to resume after a break) waits for a write turn and a throttled
stream is reported to the budget, so a job writing checkpoints to a Rapid
bucket stays inside the same job-wide rate as one writing over JSON.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from torchbucket import runtime
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.runtime import budget
from torchbucket.runtime.budget import BudgetConfig
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator
pytest.importorskip("grpc")

RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture
def store(
    emu: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, GCSStore]]:
    monkeypatch.setenv("TORCHBUCKET_BUDGET_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHBUCKET_BUDGET", raising=False)
    name = f"zonal-budget-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=True)
    assert emu.grpc_endpoint is not None
    config = GCSConfig(
        endpoint=emu.endpoint,
        grpc_endpoint=f"http://{emu.grpc_endpoint}",
        retry=RETRY,
        budget=BudgetConfig(enabled=True),
    )
    yield name, GCSStore(name, config=config)
    emu.clear_faults()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for at in range(0, len(data), 1 << 20):
        yield data[at : at + (1 << 20)]


def _writes(bucket: str) -> dict[str, int]:
    row = budget.status()[bucket]["write"]
    return {"sent": row["sent"], "throttled": row["throttled"]}


def test_a_streamed_write_spends_one_write_per_stream(store: tuple[str, GCSStore]) -> None:
    bucket, gcs = store
    data = random.Random(3).randbytes(5 << 20)
    before = _writes(bucket)
    runtime.run(gcs.put_stream("obj.bin", _chunks(data)))
    after = _writes(bucket)
    # The data object's stream, plus the pointer object written after it (one
    # message, through the JSON-style retry loop): at least the stream's write.
    assert after["sent"] - before["sent"] >= 2, (before, after)
    assert runtime.run(gcs.get("obj.bin")) == data


def test_a_throttled_stream_is_reported_and_its_retry_spends_again(
    emu: Emulator, store: tuple[str, GCSStore]
) -> None:
    bucket, gcs = store
    data = random.Random(4).randbytes(3 << 20)
    emu.add_fault("put", "429", nth=1)
    before = _writes(bucket)
    runtime.run(gcs.put_stream("throttled.bin", _chunks(data)))
    after = _writes(bucket)
    assert after["throttled"] - before["throttled"] >= 1, (before, after)
    # The refused stream and the one that wrote the object each spent a turn.
    assert after["sent"] - before["sent"] >= 3, (before, after)
    assert runtime.run(gcs.get("throttled.bin")) == data
