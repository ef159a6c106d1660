"""The library's request counts equal the emulator's own, over HTTP, for every operation."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from torchbucket import accounting, runtime
from torchbucket.config import HedgeConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.base import ObjectInfo

pytestmark = pytest.mark.emulator


# Exact equality with the server needs no hedged reads: a hedge cancelled while
# it was still connecting is counted here and never reaches the server, and a
# request cancelled mid-answer was sent whole by the server (docs/reliability.md).
NO_HEDGE = HedgeConfig(enabled=False)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """A private model-store emulator per test, in place of the session's.

    These tests compare every request the server saw with the client's counts.
    On the session's emulator a request of an earlier test still in flight (a
    retry after its backoff) can land meanwhile: a clean-clone CI run once
    counted a stray ``bucket_get`` here.
    """
    with Emulator() as emu:
        yield emu


def _server_ops(emu: Emulator, bucket: str) -> dict[str, int]:
    # The bucket's own requests: a private emulator can still be reached by a
    # request of an earlier test's client that retries against a port the
    # operating system has since given to this one (a clean-clone CI run
    # counted a stray ``bucket_get`` here even so).
    ops = emu.stats()["by_bucket"].get(bucket, {}).get("by_op", {})
    return {op: n for op, n in ops.items() if n}


def _server_bytes(emu: Emulator, bucket: str) -> tuple[int, int]:
    mine = emu.stats()["by_bucket"].get(bucket, {})
    return mine.get("bytes_in", 0), mine.get("bytes_out", 0)


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _every_operation(store: Any) -> None:
    async def work() -> None:
        small = await store.put("a/small", b"x" * 1000)
        big = b"y" * (3 << 20)
        await store.put("a/big", big)  # resumable: more than one request
        await store.put_stream("a/streamed", _chunks(b"1" * 10, b"2" * 10))
        await store.list_page("a/")
        await store.head("a/small")
        await store.get("a/small")
        await store.get("a/small", start=10, end=20)
        buffer = memoryview(bytearray(2 << 20))
        await store.get_into("a/big", buffer, start=0)  # the in-place reader
        await store.get_into("a/big", memoryview(bytearray(100)), start=5)
        async for _ in store.stream("a/big", chunk_size=1 << 20):
            pass
        second = await store.put("a/second", b"z" * 10)
        await store.compose("a/composite", [small, second])
        await store.copy("a/small", "a/copied")
        upload = await store.multipart_initiate("a/mpu")
        part = await store.multipart_upload_part("a/mpu", upload, 1, b"p" * 100)
        await store.multipart_complete("a/mpu", upload, [part])
        aborted = await store.multipart_initiate("a/mpu2")
        await store.multipart_list("a/")
        await store.multipart_abort("a/mpu2", aborted)
        await store.delete("a/copied")
        await store.bucket_exists()
        assert isinstance(small, ObjectInfo)

    runtime.run(work())


def test_counts_equal_the_servers_for_every_operation(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(
        emulator, max_simple_upload_size=1 << 20, upload_chunk_size=1 << 20, hedge=NO_HEDGE
    )
    emulator.reset_stats()
    with accounting.measure() as m:
        _every_operation(store)
    server = emulator.stats()
    mine = m.stats
    assert dict(mine.by_op) == _server_ops(emulator, store.bucket)
    assert {"list", "put", "resumable", "compose", "copy", "get", "head", "delete"} <= set(
        mine.by_op
    )
    assert {"mpu_initiate", "mpu_part", "mpu_complete", "mpu_list", "mpu_abort"} <= set(mine.by_op)
    assert (mine.class_a, mine.class_b, mine.free) == (
        server["by_class"]["A"],
        server["by_class"]["B"],
        server["by_class"]["free"],
    )
    # Bodies: the server counts what it received and sent, headers excluded.
    assert (mine.bytes_out, mine.bytes_in) == _server_bytes(emulator, store.bucket)


def test_retries_and_throttles_are_counted(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator, hedge=NO_HEDGE)
    runtime.run(store.put("k", b"data"))
    emulator.add_fault("get", "503", count=2)
    emulator.add_fault("list", "500", count=1)
    emulator.reset_stats()
    with accounting.measure() as m:
        assert runtime.run(store.get("k")) == b"data"
        runtime.run(store.list_page(""))
    server = emulator.stats()
    assert dict(m.stats.by_op) == _server_ops(emulator, store.bucket) == {"get": 3, "list": 2}
    assert m.stats.retries == 3
    assert m.stats.throttled == server["by_status"].get("503", 0) == 2
    assert 0 < m.stats.throttle_wait_s <= m.stats.retry_wait_s


def test_memory_store_counts_the_same_operations() -> None:
    from torchbucket.storage.memory import MemoryStore

    store = MemoryStore("acct-mem")

    async def bucket_exists() -> bool:
        return True

    store.bucket_exists = bucket_exists  # type: ignore[attr-defined]
    with accounting.measure() as m:
        _every_operation(store)
    ops = dict(m.stats.by_op)
    # One request per operation: a resumable upload is one put here.
    assert ops == {
        "put": 4,
        "list": 1,
        "head": 1,
        "get": 5,
        "compose": 1,
        "copy": 1,
        "mpu_initiate": 2,
        "mpu_part": 1,
        "mpu_complete": 1,
        "mpu_list": 1,
        "mpu_abort": 1,
        "delete": 1,
    }


def test_bytes_of_gzip_encoded_objects_are_counted(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import gzip

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    store = gcs_bucket_factory(emulator, hedge=NO_HEDGE)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.endpoint)
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    blob = client.bucket(store.bucket).blob("z/encoded.txt")
    blob.content_encoding = "gzip"
    text = b"transcoded " * 50_000
    blob.upload_from_string(gzip.compress(text), content_type="text/plain")
    # The official client's upload also GETs the bucket; the server has been
    # seen to count that request after the upload had returned (the stray
    # ``bucket_get`` of earlier CI runs), inside the window measured below.
    # Wait until the server has counted it (at most 10 s) before resetting.
    deadline = time.monotonic() + 10.0
    while not _server_ops(emulator, store.bucket).get("bucket_get") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)

    async def read() -> None:
        assert await store.get("z/encoded.txt") == text
        assert b"".join([c async for c in store.stream("z/encoded.txt", chunk_size=1 << 16)]) == (
            text
        )

    emulator.reset_stats()
    with accounting.measure() as m:
        runtime.run(read())
    assert dict(m.stats.by_op) == _server_ops(emulator, store.bucket)
    assert m.stats.bytes_in == _server_bytes(emulator, store.bucket)[1] > 0
