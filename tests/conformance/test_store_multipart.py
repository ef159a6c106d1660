"""Multipart uploads: parts in any order, invisible until complete, abort, list."""

from __future__ import annotations

import pytest

from torchbucket.errors import NotFoundError, StorageError
from torchbucket.storage.base import Part
from torchbucket.storage.crc32c import extend

from .conftest import SyncStore

PARTS = {1: b"a" * 3000, 2: b"b" * 2000, 3: b"c" * 17}


def _upload_parts(s: SyncStore, name: str, upload_id: str, order: list[int]) -> list[Part]:
    parts = [s.mpu("upload_part", name, upload_id, n, PARTS[n]) for n in order]
    return sorted(parts, key=lambda p: p.number)


def test_parts_uploaded_out_of_order_assemble_by_number(s: SyncStore) -> None:
    upload_id = s.mpu("initiate", "ckpt/model.pt")
    parts = _upload_parts(s, "ckpt/model.pt", upload_id, [3, 1, 2])
    assert [p.number for p in parts] == [1, 2, 3]
    info = s.mpu("complete", "ckpt/model.pt", upload_id, parts)
    expected = PARTS[1] + PARTS[2] + PARTS[3]
    assert info.name == s.k("ckpt/model.pt")
    assert info.size == len(expected)
    assert s.get("ckpt/model.pt") == expected
    assert s.multipart_list() == []
    assert s.list_all() == ["ckpt/model.pt"]


def test_a_part_given_as_several_buffers_is_their_bytes_in_order(s: SyncStore) -> None:
    # How a checkpoint's part gathered from its tensors' memory is sent; the
    # CRC32C declared is that of the whole part.
    data = PARTS[1] + PARTS[2]
    pieces = [
        memoryview(PARTS[1]),
        memoryview(bytearray(PARTS[2]))[:999],
        memoryview(PARTS[2])[999:],
    ]
    upload_id = s.mpu("initiate", "obj")
    part = s.mpu("upload_part", "obj", upload_id, 1, pieces, crc32c=extend(0, data))
    s.mpu("complete", "obj", upload_id, [part])
    assert s.get("obj") == data


def test_upload_is_invisible_until_complete(s: SyncStore) -> None:
    upload_id = s.mpu("initiate", "obj")
    parts = _upload_parts(s, "obj", upload_id, [1, 2])
    assert s.list_all() == []
    with pytest.raises(NotFoundError):
        s.head("obj")
    s.mpu("complete", "obj", upload_id, parts)
    assert s.get("obj") == PARTS[1] + PARTS[2]


def test_a_part_uploaded_twice_keeps_the_last(s: SyncStore) -> None:
    upload_id = s.mpu("initiate", "obj")
    s.mpu("upload_part", "obj", upload_id, 1, b"first try")
    part = s.mpu("upload_part", "obj", upload_id, 1, b"second")
    s.mpu("complete", "obj", upload_id, [part])
    assert s.get("obj") == b"second"


def test_complete_replaces_an_existing_object(s: SyncStore) -> None:
    s.put("obj", b"old contents")
    upload_id = s.mpu("initiate", "obj")
    parts = _upload_parts(s, "obj", upload_id, [1])
    s.mpu("complete", "obj", upload_id, parts)
    assert s.get("obj") == PARTS[1]


def test_abort_leaves_nothing_visible(s: SyncStore) -> None:
    upload_id = s.mpu("initiate", "dir/obj")
    _upload_parts(s, "dir/obj", upload_id, [1, 2])
    s.mpu("abort", "dir/obj", upload_id)
    assert s.multipart_list() == []
    assert s.list_all() == []
    with pytest.raises(NotFoundError):
        s.head("dir/obj")
    with pytest.raises(NotFoundError):
        s.mpu("abort", "dir/obj", upload_id)
    with pytest.raises(NotFoundError):
        s.mpu("upload_part", "dir/obj", upload_id, 1, b"late")


def test_complete_with_an_unknown_part_fails(s: SyncStore) -> None:
    upload_id = s.mpu("initiate", "obj")
    parts = _upload_parts(s, "obj", upload_id, [1])
    with pytest.raises(StorageError):
        s.mpu("complete", "obj", upload_id, [*parts, Part(2, parts[0].etag)])
    with pytest.raises(NotFoundError):
        s.head("obj")


def test_list_finds_incomplete_uploads_under_a_prefix(s: SyncStore) -> None:
    first = s.mpu("initiate", "ckpt/a")
    second = s.mpu("initiate", "ckpt/b")
    s.mpu("upload_part", "ckpt/b", second, 1, b"x")
    other = s.mpu("initiate", "other/c")
    found = s.multipart_list("ckpt/")
    assert [(s.rel(u.key), u.upload_id) for u in found] == [("ckpt/a", first), ("ckpt/b", second)]
    assert {s.rel(u.key) for u in s.multipart_list()} == {"ckpt/a", "ckpt/b", "other/c"}
    for key, upload_id in (("ckpt/a", first), ("ckpt/b", second), ("other/c", other)):
        s.mpu("abort", key, upload_id)
    assert s.multipart_list() == []


def test_part_numbers_outside_the_range_are_rejected(s: SyncStore) -> None:
    upload_id = s.mpu("initiate", "obj")
    for number in (0, 10_001):
        with pytest.raises(ValueError):
            s.mpu("upload_part", "obj", upload_id, number, b"x")
    s.mpu("abort", "obj", upload_id)


@pytest.mark.parametrize("name", ["dir/ünï cødé #?%+.pt", "a/b/c/d.bin"])
def test_unusual_names_upload_and_list(s: SyncStore, name: str) -> None:
    upload_id = s.mpu("initiate", name)
    assert [(s.rel(u.key), u.upload_id) for u in s.multipart_list()] == [(name, upload_id)]
    part = s.mpu("upload_part", name, upload_id, 1, b"payload")
    info = s.mpu("complete", name, upload_id, [part])
    assert info.name == s.k(name)
    assert s.get(name) == b"payload"
    assert s.list_all() == [name]
