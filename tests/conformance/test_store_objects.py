"""Reads, writes, generations, delete and copy: the same behaviour on every backend."""

from __future__ import annotations

import os
import pickle
from collections.abc import AsyncIterator

import pytest

from torchbucket.errors import NotFoundError, PreconditionFailedError
from torchbucket.storage.base import ObjectStore

from .conftest import SyncStore

DATA = bytes(range(256)) * 4  # 1 KiB, every byte value


def test_put_then_get_returns_the_same_bytes(s: SyncStore) -> None:
    info = s.put("obj", DATA)
    assert info.name == s.k("obj")
    assert info.size == len(DATA)
    assert s.get("obj") == DATA
    head = s.head("obj")
    assert (head.name, head.size, head.generation) == (info.name, len(DATA), info.generation)


def test_put_accepts_bytearray_and_memoryview(s: SyncStore) -> None:
    s.put("ba", bytearray(b"from a bytearray"))
    s.put("mv", memoryview(DATA)[10:20])
    assert s.get("ba") == b"from a bytearray"
    assert s.get("mv") == DATA[10:20]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (10, None, DATA[10:]),
        (10, 20, DATA[10:20]),
        (0, 1, DATA[:1]),
        (1000, 5000, DATA[1000:]),  # end past the size is cut at the size
        (len(DATA) - 1, None, DATA[-1:]),
        (len(DATA), None, b""),  # start at the end
        (5000, None, b""),  # start past the end
        (7, 7, b""),  # zero-length range
    ],
)
def test_byte_ranges(s: SyncStore, start: int, end: int | None, expected: bytes) -> None:
    s.put("obj", DATA)
    assert s.get("obj", start=start, end=end) == expected


def test_empty_object(s: SyncStore) -> None:
    info = s.put("empty", b"")
    assert info.size == 0
    assert s.get("empty") == b""
    assert s.get("empty", start=0, end=10) == b""
    assert s.head("empty").size == 0
    assert s.stream("empty") == []
    assert s.get_into("empty", memoryview(bytearray(4))) == 0


def test_bad_range_arguments_are_rejected(s: SyncStore) -> None:
    s.put("obj", DATA)
    with pytest.raises(ValueError):
        s.get("obj", start=-1)
    with pytest.raises(ValueError):
        s.get("obj", start=10, end=5)


def test_missing_object_is_a_file_not_found_naming_the_uri(s: SyncStore) -> None:
    for call in (
        lambda: s.get("nope"),
        lambda: s.get("nope", start=3, end=9),
        lambda: s.head("nope"),
        lambda: s.stream("nope"),
        lambda: s.get_into("nope", memoryview(bytearray(8))),
        lambda: s.delete("nope"),
    ):
        with pytest.raises(NotFoundError) as info:
            call()
        assert isinstance(info.value, FileNotFoundError)
        assert s.uri("nope") in str(info.value)


def test_rewrite_changes_the_generation_and_old_pins_fail(s: SyncStore) -> None:
    first = s.put("obj", b"one")
    second = s.put("obj", b"two")
    assert first.generation is not None and second.generation is not None
    assert second.generation != first.generation
    assert s.get("obj", generation=second.generation) == b"two"
    with pytest.raises(NotFoundError):
        s.get("obj", generation=first.generation)
    with pytest.raises(NotFoundError):
        s.get_into("obj", memoryview(bytearray(3)), generation=first.generation)


def test_if_generation_match_zero_creates_only(s: SyncStore) -> None:
    created = s.put("obj", b"first", if_generation_match=0)
    with pytest.raises(PreconditionFailedError) as info:
        s.put("obj", b"second", if_generation_match=0)
    assert s.uri("obj") in str(info.value)
    assert s.get("obj") == b"first"
    assert s.head("obj").generation == created.generation


def test_if_generation_match_current_replaces_and_stale_fails(s: SyncStore) -> None:
    first = s.put("obj", b"one")
    second = s.put("obj", b"two", if_generation_match=first.generation)
    with pytest.raises(PreconditionFailedError):
        s.put("obj", b"three", if_generation_match=first.generation)
    assert s.get("obj") == b"two"
    assert s.head("obj").generation == second.generation


def test_get_into_fills_the_buffer(s: SyncStore) -> None:
    s.put("obj", DATA)
    buffer = bytearray(100)
    assert s.get_into("obj", memoryview(buffer), start=50) == 100
    assert bytes(buffer) == DATA[50:150]
    tail = bytearray(100)
    n = s.get_into("obj", memoryview(tail), start=len(DATA) - 30)
    assert n == 30
    assert bytes(tail[:30]) == DATA[-30:]


def test_a_large_range_lands_in_the_buffer(s: SyncStore) -> None:
    # Over 1 MiB: on GCS the in-place ranged reader (gcs/_rawget) receives it,
    # over HTTPS too on gcs-model-https.
    data = os.urandom(3 << 20)
    s.put("big", data)
    buffer = bytearray(2 << 20)
    assert s.get_into("big", memoryview(buffer), start=1 << 20) == len(buffer)
    assert bytes(buffer) == data[1 << 20 :]
    if s.backend.startswith("gcs"):
        raw = s.store._transport._raw  # type: ignore[attr-defined]
        assert raw is not None and raw.endpoint == s.store.endpoint  # type: ignore[attr-defined]


def test_stream_yields_the_object_in_chunks(s: SyncStore) -> None:
    s.put("obj", DATA)
    chunks = s.stream("obj", chunk_size=100)
    assert b"".join(chunks) == DATA
    assert all(len(c) <= 100 for c in chunks)
    assert b"".join(s.stream("obj", start=100, end=350, chunk_size=64)) == DATA[100:350]
    assert b"".join(s.stream("obj", start=1000)) == DATA[1000:]


async def _chunks(parts: list[bytes], fail: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if fail:
        raise RuntimeError("the producer failed")


def test_put_stream_writes_the_concatenation(s: SyncStore) -> None:
    parts = [b"a" * 1000, b"", b"b" * 70_000, b"c" * 3]
    info = s.put_stream("streamed", _chunks(parts))
    assert info.size == sum(map(len, parts))
    assert s.get("streamed") == b"".join(parts)


def test_put_stream_that_fails_leaves_nothing(s: SyncStore) -> None:
    with pytest.raises(RuntimeError, match="producer failed"):
        s.put_stream("broken", _chunks([b"x" * 5000], fail=True))
    with pytest.raises(NotFoundError):
        s.head("broken")
    assert s.list_all() == []


def test_delete(s: SyncStore) -> None:
    info = s.put("obj", b"bytes")
    s.delete("obj", generation=info.generation)
    with pytest.raises(NotFoundError):
        s.head("obj")
    with pytest.raises(NotFoundError):
        s.delete("obj")
    assert s.list_all() == []


def test_delete_of_a_stale_generation_keeps_the_object(s: SyncStore) -> None:
    first = s.put("obj", b"one")
    s.put("obj", b"two")
    with pytest.raises(NotFoundError):
        s.delete("obj", generation=first.generation)
    assert s.get("obj") == b"two"


def test_copy(s: SyncStore) -> None:
    s.put("src", DATA)
    info = s.copy("src", "dir/dst")
    assert info.name == s.k("dir/dst")
    assert info.size == len(DATA)
    assert s.get("dir/dst") == DATA
    assert s.get("src") == DATA
    with pytest.raises(NotFoundError):
        s.copy("missing", "elsewhere")


def test_copy_pinned_to_a_replaced_generation_copies_nothing(s: SyncStore) -> None:
    # A checkpoint's staged object is copied by the generation checked: a
    # replacement since must not become the copy (checkpoint/_staging.py).
    checked = s.put("src", DATA)
    assert s.copy("src", "dst", source_generation=checked.generation).name == s.k("dst")
    s.put("src", b"another writer's bytes")
    with pytest.raises(NotFoundError):
        s.copy("src", "dst", source_generation=checked.generation)
    assert s.get("dst") == DATA


@pytest.mark.parametrize(
    "name",
    [
        "ünïcødé/日本語/файл",
        "with space/and  two",
        "sym#bols?%+&=;,@!$'()*",
        "emoji-🚀.bin",
        "/".join(["d" * 180] * 4) + "/tail",  # ~730 bytes, segments a filesystem accepts
    ],
)
def test_unusual_names_round_trip(s: SyncStore, name: str) -> None:
    s.put(name, name.encode())
    assert s.get(name) == name.encode()
    assert s.head(name).name == s.k(name)
    assert s.list_all() == [name]
    assert s.list_all(name) == [name]
    s.delete(name)
    assert s.list_all() == []


def test_store_pickles_and_reads_the_same_objects(s: SyncStore) -> None:
    s.put("obj", b"pickled")
    clone: ObjectStore = pickle.loads(pickle.dumps(s.store))
    assert clone.bucket == s.store.bucket
    assert SyncStore(clone, s.root, s.backend).get("obj") == b"pickled"


def test_put_stream_of_nothing_is_an_empty_object(s: SyncStore) -> None:
    info = s.put_stream("empty", _chunks([]))
    assert info.size == 0
    assert s.get("empty") == b""
    assert s.list_all() == ["empty"]
