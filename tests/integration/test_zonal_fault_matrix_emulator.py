"""The fault matrix on the gRPC path: checkpoint saves on a zonal bucket under write faults.

What ``tests/reliability/test_fault_matrix.py`` is for the JSON and XML APIs,
for a zonal (Rapid) bucket of the emulator over gRPC, where a save streams a
hidden data object over ``BidiWriteObject`` and then points the checkpoint's
name at it. Every gRPC write is a ``put`` request to the emulator (the data
object's stream, each stream reopened to resume it, the pointer), and a rule
hits one of them, three, or every one until the client's retry deadline (one
second) has passed:

- ``503``, ``429``: the stream's open is refused (UNAVAILABLE,
  RESOURCE_EXHAUSTED), and retried;
- ``truncate``: the stream breaks mid-append after a flush (at the first
  flush or finish after one it persisted): what was sent since is lost and
  the writer resumes from the persisted size;
- ``corrupt_request``: a chunk damaged on its way up, refused by the server's
  CRC32C check. The client sees the refusal (INVALID_ARGUMENT, not retried:
  the save fails) or, when the server ended the stream while a later message
  was being sent, only grpc's own INTERNAL for that send (retried: the stream
  is reopened and the bytes sent again, as the JSON API path sends a refused
  part again); either way the checkpoint is never damaged;
- ``stall``: a stream held past the stall, then broken.

A save either completes and loads exactly the new checkpoint, or raises a
torchbucket error naming the checkpoint, and the previous checkpoint loads
unchanged. Either way no half-checkpoint is visible: the listing shows the
name once, with the size of the checkpoint it loads, and no data object is
left that no pointer names. A save SIGKILLed after a flush leaves the
previous checkpoint and only a hidden data object, which cleanup removes.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import DeadlineExceededError, StorageError
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.pages import list_all

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]
pytest.importorskip("grpc")

KEY = "run/ckpt.pt"
STALL_SECONDS = 3.0
RECOVER = RetryConfig(
    initial_backoff=0.005, max_backoff=0.02, deadline=20.0, attempt_timeout=5.0, read_timeout=2.0
)
GIVE_UP = RetryConfig(
    initial_backoff=0.005, max_backoff=0.02, deadline=1.0, attempt_timeout=0.5, read_timeout=2.0
)
#: 256 KiB resumable chunks: a gRPC write flushes every 1 MiB, so a save of
#: :func:`state` (4 MiB) flushes several times before it finishes.
CHUNK = 256 * 1024

KINDS = ("503", "429", "truncate", "corrupt_request", "stall")
MODES = ("once", "repeated", "past_deadline")
COUNT: dict[str, int | None] = {"once": 1, "repeated": 3, "past_deadline": None}


def expected(kind: str, mode: str) -> set[str]:
    """``"ok"`` (the new checkpoint) or ``"error"`` (the previous one stays)."""
    if kind == "corrupt_request":
        return {"ok", "error"}  # refused, or sent again (see the module)
    return {"error"} if mode == "past_deadline" else {"ok"}


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture
def bucket(emu: Emulator) -> Iterator[str]:
    name = f"zfm-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=True)
    yield name
    emu.clear_faults()


def _gcs(emu: Emulator, retry: RetryConfig = RECOVER) -> GCSConfig:
    assert emu.grpc_endpoint is not None
    return GCSConfig(
        endpoint=emu.endpoint,
        grpc_endpoint=f"http://{emu.grpc_endpoint}",
        retry=retry,
        upload_chunk_size=CHUNK,
    )


def state(seed: int) -> dict[str, Any]:
    """A checkpoint's content, 4 MiB, different for each seed."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(1024, 1024, generator=g), "step": seed}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(torch.equal(a["w"], b["w"])) and a["step"] == b["step"]


def _visible(emu: Emulator, bucket: str) -> tuple[list[tuple[str, int]], int]:
    """What a listing of the checkpoint's folder shows, and how many data objects
    (under the hidden prefix) no pointer names."""
    store = GCSStore(bucket, config=_gcs(emu))
    try:
        listed = [(o.name, o.size) for o in runtime.run(list_all(store, "run/"))]
        orphans = runtime.run(store.zonal_orphans(""))
    finally:
        runtime.run(store.close())
    return listed, len(orphans)


def _fired(emu: Emulator) -> int:
    fired = sum(rule["fired"] for rule in emu.faults())
    emu.clear_faults()
    return fired


@pytest.mark.parametrize(("kind", "mode"), list(itertools.product(KINDS, MODES)))
def test_a_faulted_save_keeps_the_previous_checkpoint(
    emu: Emulator, bucket: str, kind: str, mode: str
) -> None:
    uri = f"gs://{bucket}/{KEY}"
    good = BucketCheckpoint(gcs=_gcs(emu))
    good.save(state(1), uri)
    size_before = _visible(emu, bucket)[0]
    faulted = BucketCheckpoint(
        config=CheckpointConfig(part_size=256 * 1024, min_part_size=1024),
        gcs=_gcs(emu, GIVE_UP if mode == "past_deadline" else RECOVER),
    )
    emu.add_fault("put", kind, count=COUNT[mode], stall_seconds=STALL_SECONDS)
    try:
        faulted.save(state(2), uri)
    except StorageError as exc:
        outcome, error = "error", exc
    else:
        outcome, error = "ok", None
    assert _fired(emu) >= 1, "the fault never fired: the case tested nothing"
    assert outcome in expected(kind, mode), repr(error)
    survivor = good.load(uri, weights_only=True)
    listed, orphans = _visible(emu, bucket)
    if outcome == "ok":
        assert same(survivor, state(2))
    else:
        assert uri in str(error)
        if mode == "past_deadline" and kind != "corrupt_request":
            assert isinstance(error, DeadlineExceededError)
        assert same(survivor, state(1)), "a failed save changed the checkpoint"
        assert listed == size_before
    # The name, once, at the size of what it loads; no half-written object
    # under any name, and no data object left that no pointer names.
    assert [name for name, _ in listed] == [KEY]
    assert orphans == 0


_SAVER = """
import sys, time
from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.storage.gcs import GCSConfig
gcs = GCSConfig(endpoint=sys.argv[1], grpc_endpoint=sys.argv[2], upload_chunk_size=256 * 1024)
with BucketCheckpoint(gcs=gcs).writer(sys.argv[3]) as f:
    chunk = bytes(range(256)) * 4096
    while f.tell() < 16 << 20:
        f.write(chunk)
    print("UPLOADING", flush=True)
    while True:
        f.write(chunk)
        time.sleep(0.05)
"""


def test_a_save_killed_after_a_flush_keeps_the_previous_checkpoint(
    emu: Emulator, bucket: str
) -> None:
    uri = f"gs://{bucket}/{KEY}"
    good = BucketCheckpoint(gcs=_gcs(emu))
    good.save(state(1), uri)
    before = _visible(emu, bucket)
    gcs = _gcs(emu)
    child = subprocess.Popen(
        [sys.executable, "-c", _SAVER, gcs.endpoint or "", gcs.grpc_endpoint or "", uri],
        stdout=subprocess.PIPE,
        text=True,
    )
    store = GCSStore(bucket, config=gcs)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "UPLOADING"
        # The save's data object holds flushed bytes (persisted, unfinalized).
        deadline = 200
        persisted = 0
        while persisted < 4 << 20 and deadline:
            found = runtime.run(store.zonal_orphans(""))
            persisted = max((info.size for info, _ in found), default=0)
            deadline -= 1
            time.sleep(0.05)
        assert persisted >= 4 << 20
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert same(good.load(uri, weights_only=True), state(1))
    listed, orphans = _visible(emu, bucket)
    assert listed == before[0]  # only the name, at the previous checkpoint's size
    assert orphans == 1  # the killed save's data object, hidden
    found = runtime.run(store.zonal_orphans(""))
    assert runtime.run(store.remove_zonal_orphans(found))[0] == 1
    assert _visible(emu, bucket)[1] == 0
    assert same(good.load(uri, weights_only=True), state(1))
    runtime.run(store.close())


def test_a_load_checks_the_object_from_the_chunks_checksums(
    emu: Emulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No second pass over the download: the object's CRC32C is combined from
    # the ranges', each chunk checked against the server's on arrival; a chunk
    # damaged on the way down is still caught (and read again).
    from torchbucket.checkpoint import _reader

    uri = f"gs://{bucket}/{KEY}"
    ck = BucketCheckpoint(config=CheckpointConfig(range_size=1 << 20), gcs=_gcs(emu))
    ck.save(state(3), uri)

    class NoPass:
        def update(self, data: object) -> None:
            raise AssertionError("the download was checksummed again")

    monkeypatch.setattr(_reader, "Crc32c", NoPass)
    assert same(ck.load(uri, weights_only=True), state(3))
    emu.add_fault("get", "corrupt", nth=3)
    assert same(ck.load(uri, weights_only=True), state(3))
    assert _fired(emu) == 1
