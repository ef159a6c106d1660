"""Errors users see: a missing bucket, denied access, each naming the URI."""

from __future__ import annotations

from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.errors import BucketNotFoundError, PermissionDeniedError
from torchbucket.storage.memory import MemoryStore

from .conftest import FAST_RETRY, GCS_BACKENDS, SyncStore


@pytest.mark.parametrize("backend", ["memory", *GCS_BACKENDS])
def test_missing_bucket_is_a_bucket_not_found_naming_it(
    backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "memory":
        store: Any = MemoryStore("conf-no-such-bucket", create=False)
    else:
        from torchbucket.storage.gcs import GCSConfig, GCSStore

        emulator = request.getfixturevalue("emulator" if backend == "gcs-model" else "fake_gcs")
        store = GCSStore(
            "conf-no-such-bucket", config=GCSConfig(endpoint=emulator.endpoint, retry=FAST_RETRY)
        )
    with pytest.raises(BucketNotFoundError) as info:
        runtime.run(store.list_page("some/prefix/"))
    assert isinstance(info.value, FileNotFoundError)
    assert "conf-no-such-bucket" in str(info.value)


@pytest.mark.parametrize("backend", GCS_BACKENDS)
@pytest.mark.parametrize("op", ["get", "list", "put"])
def test_forbidden_is_a_permission_error_naming_the_uri(s: SyncStore, op: str) -> None:
    s.put("obj", b"data")
    s.emulator.add_fault(op, "403", count=1)
    try:
        with pytest.raises(PermissionDeniedError) as info:
            if op == "get":
                s.get("obj")
            elif op == "list":
                s.list_page("")
            else:
                s.put("obj", b"new")
    finally:
        s.emulator.clear_faults()
    assert isinstance(info.value, PermissionError)
    assert info.value.status == 403
    assert s.uri("obj" if op != "list" else "") in str(info.value)
    assert s.get("obj") == b"data"
