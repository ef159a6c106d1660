"""`torchbucket cleanup` on a zonal bucket: data objects no pointer names, over gRPC.

A zonal save over 2 MiB writes a data object under ``torchbucket-zonal-objects/``
and then points the checkpoint's name at it; a save killed (or failed and
unable to delete) in between leaves the data object. Cleanup removes those no
pointer names, spares those younger than ``--older-than`` and the live
checkpoints' data, and ``--dry-run`` removes nothing. Replacing a checkpoint,
even from a process that never saw the old pointer, leaves one data object.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.cli import main
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.gcs._pointers import GENERATION, SIZE, TARGET

pytestmark = pytest.mark.emulator
pytest.importorskip("grpc")

PREFIX = "torchbucket-zonal-objects/"
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)
SAVER = (
    "import sys, time; from torchbucket.checkpoint import BucketCheckpoint; "
    "from torchbucket.storage.gcs import GCSConfig; "
    "ck = BucketCheckpoint(gcs=GCSConfig(endpoint=sys.argv[1], grpc_endpoint=sys.argv[2]))\n"
    "with ck.writer(sys.argv[3]) as f:\n"
    "    chunk = bytes(range(256)) * 4096\n"
    "    while f.tell() < 12 << 20: f.write(chunk)\n"
    "    print('UPLOADING', flush=True)\n"
    "    while True: f.write(chunk); time.sleep(0.05)\n"
)


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture(autouse=True)
def _grpc_env(emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The CLI's store finds the bucket zonal as a user's would: told the gRPC port.
    monkeypatch.setenv("TORCHBUCKET_GCS_GRPC_ENDPOINT", f"http://{emu.grpc_endpoint}")
    yield
    emu.clear_faults()


@pytest.fixture
def bucket(emu: Emulator) -> str:
    name = f"zclean-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=True)
    return name


def _gcs(emu: Emulator) -> GCSConfig:
    return GCSConfig(
        endpoint=emu.endpoint, grpc_endpoint=f"http://{emu.grpc_endpoint}", retry=RETRY
    )


def cli(emu: Emulator, *argv: str) -> int:
    return main(["--endpoint", emu.endpoint, "--deadline", "20", *argv])


def data_objects(emu: Emulator, bucket: str) -> list[str]:
    return emu.object_names(bucket, PREFIX)


def kill_a_save(emu: Emulator, bucket: str, uri: str) -> None:
    """Start a save of ``uri`` in a child and SIGKILL it once its data object exists."""
    before = set(data_objects(emu, bucket))
    child = subprocess.Popen(
        [sys.executable, "-c", SAVER, emu.endpoint, f"http://{emu.grpc_endpoint}", uri],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "UPLOADING"
        deadline = time.monotonic() + 60
        while set(data_objects(emu, bucket)) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert len(set(data_objects(emu, bucket)) - before) == 1


def test_a_killed_saves_orphan_is_removed_the_live_checkpoint_kept(
    emu: Emulator, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = BucketCheckpoint(gcs=_gcs(emu))
    live = {"w": torch.randn(1024, 1024)}
    ck.save(live, f"gs://{bucket}/ck/live.pt")
    (kept,) = data_objects(emu, bucket)
    # A save of the same name killed mid-stream: its data object sits beside the live one's.
    kill_a_save(emu, bucket, f"gs://{bucket}/ck/live.pt")
    (orphan,) = set(data_objects(emu, bucket)) - {kept}
    written = time.time()
    uri = f"gs://{bucket}/"

    # Just written: a save may still own it.
    assert cli(emu, "cleanup", "--older-than", "1h", uri) == 0
    assert capsys.readouterr().out.strip() == f"nothing to clean up in {uri}"

    time.sleep(max(0.0, written + 1.5 - time.time()))
    assert cli(emu, "cleanup", "--dry-run", "--older-than", "1s", uri) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"would remove zonal data object {uri}{orphan} (")
    assert ", last written " in lines[0]
    assert lines[1].startswith("dry run: 0 composed objects, 1 zonal data object (")
    assert lines[1].endswith(f"and 0 incomplete uploads would be removed from {uri}")
    assert sorted(data_objects(emu, bucket)) == sorted([kept, orphan])  # a dry run

    assert cli(emu, "cleanup", "--older-than", "1s", uri) == 0
    out = capsys.readouterr().out
    assert f"removing zonal data object {uri}{orphan} (" in out
    assert out.splitlines()[-1].startswith("removed 0 composed objects, 1 zonal data object (")
    assert data_objects(emu, bucket) == [kept]
    assert torch.equal(ck.load(f"gs://{bucket}/ck/live.pt")["w"], live["w"])

    assert cli(emu, "cleanup", uri) == 0
    assert capsys.readouterr().out.strip() == f"nothing to clean up in {uri}"
    assert data_objects(emu, bucket) == [kept]


def test_a_failed_saves_orphan_is_removed_under_the_prefix_only(
    emu: Emulator, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = BucketCheckpoint(gcs=_gcs(emu))

    class Boom(RuntimeError):
        pass

    # The save fails and cannot delete its data object (as a crash would not).
    emu.add_fault("delete", "403", match=PREFIX, count=None)
    for key in ("run/a.pt", "other/b.pt"):
        with pytest.raises(Boom), ck.writer(f"gs://{bucket}/{key}") as f:
            torch.save({"w": torch.randn(4096, 1024)}, f)  # 16 MiB: streaming by now
            raise Boom
    emu.clear_faults()
    other, mine = data_objects(emu, bucket)
    assert mine.startswith(f"{PREFIX}run/a.pt/") and other.startswith(f"{PREFIX}other/b.pt/")

    assert cli(emu, "cleanup", f"gs://{bucket}/run/") == 0
    out = capsys.readouterr().out
    assert f"removing zonal data object gs://{bucket}/{mine} (" in out
    assert other not in out
    assert data_objects(emu, bucket) == [other]


def test_replacing_a_checkpoint_leaves_one_data_object(emu: Emulator, bucket: str) -> None:
    old, new = {"w": torch.randn(1024, 1024)}, {"w": torch.randn(1024, 1024)}
    BucketCheckpoint(gcs=_gcs(emu)).save(old, f"gs://{bucket}/ck/m.pt")
    # A store that never saw the old pointer (another process, a restarted job).
    store = GCSStore(bucket, config=_gcs(emu))

    async def chunks(data: bytes) -> AsyncIterator[bytes]:
        for at in range(0, len(data), 1 << 20):
            yield data[at : at + (1 << 20)]

    try:
        runtime.run(store.put_stream("ck/m.pt", chunks(os.urandom(3 << 20))))
    finally:
        runtime.run(store.close())
    assert len(data_objects(emu, bucket)) == 1
    ck = BucketCheckpoint(gcs=_gcs(emu))
    ck.save(new, f"gs://{bucket}/ck/m.pt")
    assert len(data_objects(emu, bucket)) == 1
    assert torch.equal(ck.load(f"gs://{bucket}/ck/m.pt")["w"], new["w"])


def test_long_keys_pinned_generations_and_a_pointer_written_since(
    emu: Emulator, bucket: str
) -> None:
    """The library calls: a hashed name, a rewrite after listing, a pointer that arrives late."""
    store = GCSStore(bucket, config=_gcs(emu))
    long_key = "deep/" + "x" * 1010

    async def chunks() -> AsyncIterator[bytes]:
        yield os.urandom(3 << 20)

    try:
        runtime.run(store.put_stream(long_key, chunks()))
        (live,) = data_objects(emu, bucket)
        hashed_orphan = f"{PREFIX}{'ab' * 16}/0123456789abcdef"
        late, rewritten = f"{PREFIX}late/0123456789abcdef", f"{PREFIX}re/0123456789abcdef"
        emu.seed(bucket, {hashed_orphan: b"h", late: b"l" * 2, rewritten: b"r" * 3})
        found = runtime.run(store.zonal_orphans())
        assert [o.name for o, _ in found] == sorted([hashed_orphan, late, rewritten])
        assert all(stamp is not None for _, stamp in found)
        # After the listing: "late" gets its pointer, "re" a new generation.
        info = {o.name: o for o, _ in found}[late]
        path = runtime.run(store._router.grpc())
        assert path is not None
        pointer = {TARGET: late, GENERATION: str(info.generation), SIZE: str(info.size)}
        runtime.run(path._one_message("late", b"", content_type=None, metadata=pointer))
        emu.seed(bucket, {rewritten: b"R" * 3})
        assert runtime.run(store.remove_zonal_orphans(found)) == (1, 1)
        assert sorted(data_objects(emu, bucket)) == sorted([live, late, rewritten])
        assert [o.name for o, _ in runtime.run(store.zonal_orphans("re"))] == [rewritten]
    finally:
        runtime.run(store.close())
