"""Real clients, unchanged, against the emulator: gcsfs and google-cloud-storage.

gcsfs 2026.x renames with the JSON API's ``objects.move`` (``moveTo``), which
the emulator serves: atomically on the model store, as a copy and a delete in
front of fake-gcs-server (which has no ``moveTo``).
https://cloud.google.com/storage/docs/json_api/v1/objects/move
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

# gcsfs 2026.x first asks the gRPC Storage Control API whether a bucket is
# zonal or hierarchical, which an HTTP-only endpoint never answers (the call
# waits out its timeout); "false" keeps it on its classic JSON API client, the
# one a flat-namespace bucket uses anyway. Set before gcsfs is imported.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
gcsfs = pytest.importorskip("gcsfs")


def _fs(emu: Emulator) -> Any:
    return gcsfs.GCSFileSystem(endpoint_url=emu.endpoint, token="anon", skip_instance_cache=True)


def _bucket(emu: Emulator) -> str:
    name = f"fs-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    return name


@pytest.mark.parametrize("fixture", ["emulator", "fake_gcs"])
def test_gcsfs_reads_writes_lists_and_deletes(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    emu: Emulator = request.getfixturevalue(fixture)
    fs, b = _fs(emu), _bucket(emu)
    small = os.urandom(1000)
    fs.pipe({f"{b}/d/a.txt": b"hello world", f"{b}/d/sub/b.bin": small})

    assert fs.ls(f"{b}/d", detail=False) == [f"{b}/d/a.txt", f"{b}/d/sub"]
    assert fs.find(b) == [f"{b}/d/a.txt", f"{b}/d/sub/b.bin"]
    assert fs.cat(f"{b}/d/a.txt") == b"hello world"
    assert fs.cat_ranges([f"{b}/d/a.txt", f"{b}/d/sub/b.bin"], [0, 100], [5, 300]) == [
        b"hello",
        small[100:300],
    ]
    with fs.open(f"{b}/d/sub/b.bin", "rb", block_size=256) as f:
        f.seek(900)
        assert f.read(50) == small[900:950]
        f.seek(10)
        assert f.read(20) == small[10:30]

    # 6 MiB in 2 MiB chunks: gcsfs's resumable upload (it goes simple under 5 MiB).
    big = os.urandom(6 << 20)
    local = tmp_path / "big.bin"
    local.write_bytes(big)
    emu.reset_stats()
    fs.put(str(local), f"{b}/big.bin", chunksize=2 << 20)
    assert emu.stats()["by_op"].get("resumable", 0) >= 3
    fs.get(f"{b}/big.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == big

    fs.rm(f"{b}/d/a.txt")
    assert not fs.exists(f"{b}/d/a.txt")
    fs.rm(f"{b}/d", recursive=True)
    assert emu.object_names(b) == ["big.bin"]


@pytest.mark.parametrize("fixture", ["emulator", "fake_gcs"])
def test_gcsfs_mv_renames_with_one_move_call(fixture: str, request: pytest.FixtureRequest) -> None:
    emu: Emulator = request.getfixturevalue(fixture)
    fs, b = _fs(emu), _bucket(emu)
    fs.pipe(f"{b}/ckpt/.metadata.tmp", b"metadata bytes")
    emu.reset_stats()
    fs.mv(f"{b}/ckpt/.metadata.tmp", f"{b}/ckpt/.metadata")
    by_op = emu.stats()["by_op"]
    # One moveTo, not gcsfs's copy-and-delete fallback (which it takes after a
    # failed moveTo other than a 404).
    assert by_op.get("move") == 1
    assert "copy" not in by_op and "delete" not in by_op
    assert emu.object_names(b) == ["ckpt/.metadata"]
    assert fs.cat(f"{b}/ckpt/.metadata") == b"metadata bytes"
    with pytest.raises(FileNotFoundError):
        fs.mv(f"{b}/ckpt/missing", f"{b}/ckpt/elsewhere")


@pytest.mark.parametrize("fixture", ["emulator", "fake_gcs"])
def test_google_cloud_storage_move_blob(
    fixture: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = pytest.importorskip("google.cloud.storage")
    from google.api_core import exceptions
    from google.auth.credentials import AnonymousCredentials

    emu: Emulator = request.getfixturevalue(fixture)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.endpoint)
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket = client.bucket(_bucket(emu))
    src = bucket.blob("src.txt")
    src.upload_from_string(b"payload", content_type="text/plain")
    src.reload()
    bucket.blob("taken").upload_from_string(b"already here")

    # The destination exists: ifGenerationMatch=0 refuses, and nothing moves.
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.move_blob(src, "taken", if_generation_match=0)
    # The source is not of that generation: refused, nothing moves.
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.move_blob(src, "dst.txt", if_source_generation_match=src.generation + 1)
    assert sorted(b.name for b in client.list_blobs(bucket.name)) == ["src.txt", "taken"]

    moved = bucket.move_blob(
        src, "dst.txt", if_generation_match=0, if_source_generation_match=src.generation
    )
    assert moved.name == "dst.txt"
    assert moved.generation != src.generation
    assert moved.metageneration == 1
    assert moved.content_type == "text/plain"
    assert moved.crc32c == src.crc32c
    assert bucket.blob("dst.txt").download_as_bytes() == b"payload"
    assert sorted(b.name for b in client.list_blobs(bucket.name)) == ["dst.txt", "taken"]
    with pytest.raises(exceptions.NotFound):
        bucket.move_blob(bucket.blob("src.txt"), "again.txt")


def _post(url: str) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_move_is_counted_as_class_a_and_faults_can_target_it(emulator: Emulator) -> None:
    b = _bucket(emulator)
    emulator.seed(b, {"a": b"x"})
    url = f"{emulator.endpoint}/storage/v1/b/{b}/o/a/moveTo/o/b"
    emulator.add_fault("move", "503")
    emulator.reset_stats()
    assert _post(url) == 503
    assert emulator.object_names(b) == ["a"]
    assert _post(url) == 200
    assert emulator.object_names(b) == ["b"]
    assert _post(f"{emulator.endpoint}/storage/v1/b/{b}/o/b/moveTo/o/b") == 400
    stats = emulator.stats()
    assert stats["by_op"]["move"] == 3
    assert stats["by_class"]["A"] == 3
