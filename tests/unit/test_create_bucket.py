"""``create_bucket`` through the storage seam (``SupportsBuckets``) on each backend."""

from __future__ import annotations

import uuid

import pytest

from torchbucket import runtime
from torchbucket.errors import BucketExistsError, BucketNotFoundError, ConfigError
from torchbucket.storage import MemoryStore, SupportsBuckets
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.local import LocalStore
from torchbucket.storage.memory import delete_memory_bucket


def test_every_backend_supports_buckets() -> None:
    for store in (MemoryStore("b"), LocalStore(), GCSStore("b")):
        assert isinstance(store, SupportsBuckets)


def test_memory_bucket_is_created_once() -> None:
    name = f"mb-{uuid.uuid4().hex[:8]}"
    store = MemoryStore(name, create=False)
    try:
        with pytest.raises(BucketNotFoundError):
            runtime.run(store.put("k", b"v"))
        runtime.run(store.create_bucket())
        runtime.run(store.put("k", b"v"))
        with pytest.raises(BucketExistsError) as info:
            runtime.run(store.create_bucket())
        assert isinstance(info.value, FileExistsError)
        assert f"memory://{name}/" in str(info.value)
    finally:
        delete_memory_bucket(name)


def test_the_local_root_always_exists() -> None:
    with pytest.raises(BucketExistsError, match="always exists"):
        runtime.run(LocalStore().create_bucket())


def test_google_needs_a_project_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    store = GCSStore("b", config=GCSConfig(endpoint="https://storage.googleapis.com"))
    with pytest.raises(ConfigError, match="GOOGLE_CLOUD_PROJECT"):
        runtime.run(store.create_bucket())
