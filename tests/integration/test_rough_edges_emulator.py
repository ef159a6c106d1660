"""Rough edges (issue 39) that need a GCS endpoint: the emulator."""

from __future__ import annotations

import io
import json
import os
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from torchbucket.dataflux.multipart_upload import multipart
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator


def content_type(emulator: Emulator, bucket: str, name: str) -> str:
    url = f"{emulator.endpoint}/storage/v1/b/{bucket}/o/{name.replace('/', '%2F')}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return str(json.load(answer)["contentType"])


@pytest.mark.parametrize("size", [1000, 12 << 20], ids=["one-request", "multipart"])
def test_the_dataflux_multipart_helper_stores_the_content_type_given(
    emulator: Emulator,
    gcs_bucket_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    size: int,
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.endpoint)
    bucket = gcs_bucket_factory(emulator, prefix="ctype").bucket
    data = os.urandom(size)
    multipart.upload_chunks_concurrently_from_bytesio(
        io.BytesIO(data), f"gs://{bucket}/notes.txt", content_type="text/plain", chunk_size=5 << 20
    )
    assert content_type(emulator, bucket, "notes.txt") == "text/plain"
    multipart.upload_chunks_concurrently_from_bytesio(
        io.BytesIO(data), f"gs://{bucket}/blob.bin", chunk_size=5 << 20
    )
    assert content_type(emulator, bucket, "blob.bin") == "application/octet-stream"
    assert sorted(emulator.object_names(bucket)) == ["blob.bin", "notes.txt"]
