"""``google-cloud-storage`` against the emulator (only where it is installed: bench extra)."""

from __future__ import annotations

import os
import uuid

import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator


@pytest.mark.parametrize("fixture", ["emulator", "fake_gcs"])
def test_google_cloud_storage_round_trip(
    fixture: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = pytest.importorskip("google.cloud.storage")
    from google.auth.credentials import AnonymousCredentials

    emu: Emulator = request.getfixturevalue(fixture)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.endpoint)
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket = client.create_bucket(f"g-{uuid.uuid4().hex[:16]}")
    bucket.blob("a/b c.txt").upload_from_string(b"hello world", content_type="text/plain")
    big = os.urandom(9 << 20)  # above the client's multipart limit: a resumable upload
    bucket.blob("big", chunk_size=1 << 20).upload_from_string(big)
    assert bucket.blob("big").download_as_bytes() == big
    assert bucket.blob("a/b c.txt").download_as_bytes(start=2, end=5) == b"llo "
    assert [b.name for b in client.list_blobs(bucket.name)] == ["a/b c.txt", "big"]
    composed = bucket.blob("c")
    composed.compose([bucket.blob("a/b c.txt"), bucket.blob("a/b c.txt")])
    assert composed.download_as_bytes() == b"hello world" * 2
    assert bucket.test_iam_permissions(["storage.objects.get"]) == ["storage.objects.get"]
