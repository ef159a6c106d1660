"""What the local-directory store does on disk, beyond the shared conformance suite."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from torchbucket import runtime
from torchbucket.errors import NotFoundError, PreconditionFailedError
from torchbucket.storage import store_for
from torchbucket.storage.local import LocalStore


def _key(path: Path) -> str:
    return str(path).lstrip("/")


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_file_uri_maps_to_the_absolute_path(tmp_path: Path) -> None:
    store, key = store_for(f"file://{tmp_path}/data/a.bin")
    assert isinstance(store, LocalStore)
    assert key == _key(tmp_path / "data" / "a.bin")
    runtime.run(store.put(key, b"on disk"))
    assert (tmp_path / "data" / "a.bin").read_bytes() == b"on disk"
    assert store.uri(key) == f"file://{tmp_path}/data/a.bin"


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = LocalStore()
    key = _key(tmp_path / "obj")
    first = runtime.run(store.put(key, b"one"))
    with pytest.raises(PreconditionFailedError):
        runtime.run(store.put(key, b"two", if_generation_match=0))
    runtime.run(store.put(key, b"three", if_generation_match=first.generation))
    assert _files(tmp_path) == ["obj"]
    assert (tmp_path / "obj").read_bytes() == b"three"


def test_generations_grow_even_within_one_clock_tick(tmp_path: Path) -> None:
    store = LocalStore()
    key = _key(tmp_path / "obj")
    generations = [runtime.run(store.put(key, bytes([i]))).generation for i in range(20)]
    assert all(g is not None for g in generations)
    assert generations == sorted(set(generations))  # type: ignore[type-var]


def test_multipart_parts_are_staged_in_a_hidden_sibling(tmp_path: Path) -> None:
    store = LocalStore()
    key = _key(tmp_path / "ckpt")
    upload_id = runtime.run(store.multipart_initiate(key))
    runtime.run(store.multipart_upload_part(key, upload_id, 1, b"part"))
    hidden = [name for name in os.listdir(tmp_path) if name.startswith(".")]
    assert len(hidden) == 1 and upload_id in hidden[0]
    assert runtime.run(store.list_page(_key(tmp_path) + "/")).objects == []
    runtime.run(store.multipart_abort(key, upload_id))
    assert os.listdir(tmp_path) == []


def test_complete_removes_the_staging_directory(tmp_path: Path) -> None:
    store = LocalStore()
    key = _key(tmp_path / "ckpt")
    upload_id = runtime.run(store.multipart_initiate(key))
    part = runtime.run(store.multipart_upload_part(key, upload_id, 1, b"whole"))
    runtime.run(store.multipart_complete(key, upload_id, [part]))
    assert _files(tmp_path) == ["ckpt"]


def test_a_failed_stream_leaves_no_spool_file(tmp_path: Path) -> None:
    store = LocalStore()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 1000
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError):
        runtime.run(store.put_stream(_key(tmp_path / "obj"), chunks()))
    assert os.listdir(tmp_path) == []


def test_large_objects_round_trip_through_worker_threads(tmp_path: Path) -> None:
    store = LocalStore()
    key = _key(tmp_path / "big")
    data = os.urandom(3 << 20)
    runtime.run(store.put(key, memoryview(data)))
    assert runtime.run(store.get(key)) == data
    buffer = bytearray(1 << 20)
    assert runtime.run(store.get_into(key, memoryview(buffer), start=1 << 20)) == 1 << 20
    assert bytes(buffer) == data[1 << 20 : 2 << 20]


def test_a_directory_is_not_an_object(tmp_path: Path) -> None:
    store = LocalStore()
    (tmp_path / "dir").mkdir()
    with pytest.raises(NotFoundError):
        runtime.run(store.get(_key(tmp_path / "dir")))
    with pytest.raises(NotFoundError):
        runtime.run(store.head(_key(tmp_path / "dir")))


def test_listing_a_missing_or_file_directory_is_empty(tmp_path: Path) -> None:
    store = LocalStore()
    (tmp_path / "file").write_bytes(b"x")
    for prefix in ("nowhere/", "file/", "nowhere/deeper/x"):
        page = runtime.run(store.list_page(_key(tmp_path) + "/" + prefix))
        assert page.objects == [] and page.next_page_token is None
