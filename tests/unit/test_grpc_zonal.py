"""The GCS store's gRPC path (issue 42) against an in-process fake of google.storage.v2.

What a user of a zonal bucket relies on: bytes come back checked (per chunk
and per object), a broken read resumes from the last byte received, a broken
write resumes from what the server holds, a save that fails or finalizes
short never replaces the object its name held, and what a zonal bucket does
not have (compose, copy, multipart) is refused as GCS refuses it.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc")

sys.path.insert(0, str(Path(__file__).parent))

from grpc_fake import FakeServer

from torchbucket import runtime
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.errors import IntegrityError, NotFoundError, StorageError
from torchbucket.runtime import accounting
from torchbucket.storage import crc32c
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.gcs._zonal import POINTER_PREFIX

MiB = 1 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    yield srv
    srv.stop()


@pytest.fixture
def store(server: FakeServer) -> Iterator[GCSStore]:
    server.storage.objects.clear()
    server.storage.calls.clear()
    config = GCSConfig(
        endpoint="http://127.0.0.1:9",
        anonymous=True,
        transport="grpc",
        grpc_endpoint=f"http://{server.target}",
        upload_chunk_size=4 * MiB,
        retry=RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=20, max_attempts=5),
        # No hedged reads: tests here count streams, and a hedge on a busy
        # machine is one more (tests/unit/test_grpc_hedge.py hedges).
        hedge=HedgeConfig(enabled=False),
    )
    s = GCSStore("b", config=config)
    yield s
    runtime.run(s.close())


def _data(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


async def _chunks(data: bytes, size: int, fail_at: int | None = None) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        if fail_at is not None and at >= fail_at:
            raise RuntimeError("the caller's data source failed")
        yield data[at : at + size]


def test_small_put_is_one_finalized_object(store: GCSStore, server: FakeServer) -> None:
    info = runtime.run(store.put("a/x", b"hello"))
    obj = server.storage.objects["a/x"]
    assert obj.finalized and bytes(obj.data) == b"hello"
    assert server.storage.calls["BidiWriteObject"] == 1
    assert info.size == 5 and info.crc32c == crc32c.b64(crc32c.extend(0, b"hello"))
    assert runtime.run(store.get("a/x")) == b"hello"
    assert runtime.run(store.get("a/x", start=1, end=3)) == b"el"
    assert runtime.run(store.get("a/x", start=9)) == b""
    head = runtime.run(store.head("a/x"))
    assert (head.size, head.generation) == (5, obj.generation)


def test_missing_object_is_not_found(store: GCSStore) -> None:
    with pytest.raises(NotFoundError):
        runtime.run(store.get("nope"))
    with pytest.raises(NotFoundError):
        runtime.run(store.head("nope"))


def test_put_stream_points_at_a_checked_data_object(store: GCSStore, server: FakeServer) -> None:
    data = _data(11 * MiB + 5)
    info = runtime.run(store.put_stream("ckpt.pt", _chunks(data, 3 * MiB)))
    objects = server.storage.objects
    (data_name,) = [n for n in objects if n.startswith(POINTER_PREFIX)]
    assert objects[data_name].finalized and bytes(objects[data_name].data) == data
    assert bytes(objects["ckpt.pt"].data) == b""  # the pointer
    assert info.size == len(data) and info.generation == objects[data_name].generation
    head = runtime.run(store.head("ckpt.pt"))
    assert (head.size, head.crc32c, head.generation) == (info.size, info.crc32c, info.generation)
    assert runtime.run(store.get("ckpt.pt")) == data
    pinned = runtime.run(store.get("ckpt.pt", start=5, end=9, generation=info.generation))
    assert pinned == data[5:9]


def test_a_fresh_store_follows_a_pointer(store: GCSStore, server: FakeServer) -> None:
    data = _data(3 * MiB, seed=3)
    runtime.run(store.put("big", data))
    other = GCSStore("b", config=store.config)
    try:
        assert runtime.run(other.get("big", start=MiB, end=MiB + 10)) == data[MiB : MiB + 10]
        buf = bytearray(len(data))
        assert runtime.run(other.get_into("big", memoryview(buf))) == len(data)
        assert bytes(buf) == data
    finally:
        runtime.run(other.close())


def test_parallel_ranges_share_a_stream(store: GCSStore, server: FakeServer) -> None:
    data = _data(8 * MiB, seed=5)
    server.put("blob", data)
    buf = bytearray(len(data))
    view = memoryview(buf)
    step = MiB

    async def load() -> list[int]:
        return await asyncio.gather(
            *(
                store.get_into("blob", view[at : at + step], start=at)
                for at in range(0, len(data), step)
            )
        )

    server.storage.calls.clear()
    assert sum(runtime.run(load())) == len(data)
    assert bytes(buf) == data
    assert server.storage.calls["BidiReadObject"] == 1


def test_ranges_added_while_the_stream_awaits_credentials_share_it(
    store: GCSStore, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stream's open awaits the request headers (a token refresh): the
    # ranges asked meanwhile wait for that open instead of each opening a
    # call of their own on the same stream (three calls, two pumps orphaned).
    from torchbucket.storage.gcs._zonal import GrpcPath

    slow = GrpcPath._metadata

    async def metadata(self: GrpcPath) -> tuple[tuple[str, str], ...]:
        await asyncio.sleep(0.05)
        return await slow(self)

    monkeypatch.setattr(GrpcPath, "_metadata", metadata)
    data = _data(3 * MiB, seed=6)
    server.put("slow", data)
    buf = bytearray(len(data))
    view = memoryview(buf)

    async def load() -> list[int]:
        return await asyncio.gather(
            *(
                store.get_into("slow", view[at : at + MiB], start=at)
                for at in range(0, len(data), MiB)
            )
        )

    server.storage.calls.clear()
    assert sum(runtime.run(load())) == len(data)
    assert bytes(buf) == data
    assert server.storage.calls["BidiReadObject"] == 1


def test_a_broken_read_resumes_from_the_last_byte(store: GCSStore, server: FakeServer) -> None:
    data = _data(5 * MiB, seed=7)
    server.put("r", data)
    server.storage.faults.break_reads_after = [2 * MiB + 1]
    before = accounting.snapshot()
    assert runtime.run(store.get("r")) == data
    assert server.storage.calls["BidiReadObject"] == 2
    received = accounting.snapshot().bytes_in - before.bytes_in
    assert received == len(data)  # nothing read twice


def test_a_corrupt_chunk_is_caught_and_read_again(store: GCSStore, server: FakeServer) -> None:
    data = _data(3 * MiB, seed=9)
    server.put("c", data)
    server.storage.faults.corrupt_reads = 1
    assert runtime.run(store.get("c")) == data
    server.storage.faults.corrupt_reads = 10_000
    with pytest.raises(IntegrityError):
        runtime.run(store.get("c"))
    server.storage.faults.corrupt_reads = 0


def test_a_broken_write_resumes(store: GCSStore, server: FakeServer) -> None:
    data = _data(10 * MiB, seed=11)
    server.storage.faults.break_writes_after = [5 * MiB]
    info = runtime.run(store.put_stream("w", _chunks(data, MiB)))
    assert info.size == len(data)
    assert runtime.run(store.get("w")) == data
    assert server.storage.calls["BidiWriteObject"] >= 3  # data, resumed, pointer


def test_a_failed_save_leaves_the_previous_object(store: GCSStore, server: FakeServer) -> None:
    old = _data(5 * MiB, seed=13)
    runtime.run(store.put_stream("ck", _chunks(old, MiB)))
    new = _data(6 * MiB, seed=17)
    with pytest.raises(RuntimeError):
        runtime.run(store.put_stream("ck", _chunks(new, MiB, fail_at=4 * MiB)))
    assert runtime.run(store.get("ck")) == old
    # A finalize that loses bytes is refused by the object's CRC32C, and the
    # bytes the server lacks are sent again from what the writer kept.
    server.storage.faults.short_finalize = 1
    runtime.run(store.put_stream("ck", _chunks(new, MiB)))
    assert runtime.run(store.get("ck")) == new
    # A server that finalizes short all the same (google-cloud-storage 3.17's
    # writer was seen to make one): the client's check of the finalized size
    # and CRC32C refuses it, and the name keeps the previous object.
    server.storage.faults.short_finalize = 1
    server.storage.faults.lax_finalize = True
    try:
        with pytest.raises(IntegrityError):
            runtime.run(store.put_stream("ck", _chunks(_data(6 * MiB, seed=23), MiB)))
    finally:
        server.storage.faults.lax_finalize = False
    assert runtime.run(store.get("ck")) == new
    data_objects = [n for n in server.storage.objects if n.startswith(POINTER_PREFIX)]
    assert len(data_objects) == 1  # the failed saves' data objects are gone


def test_a_new_save_replaces_and_delete_removes_both(store: GCSStore, server: FakeServer) -> None:
    runtime.run(store.put_stream("k", _chunks(_data(3 * MiB), MiB)))
    new = _data(3 * MiB, seed=19)
    runtime.run(store.put_stream("k", _chunks(new, MiB)))
    assert runtime.run(store.get("k")) == new
    assert len([n for n in server.storage.objects if n.startswith(POINTER_PREFIX)]) == 1
    runtime.run(store.delete("k"))
    assert server.storage.objects == {}
    with pytest.raises(NotFoundError):
        runtime.run(store.delete("k"))


def test_a_fresh_store_replacing_a_pointer_deletes_the_old_data_object(
    store: GCSStore, server: FakeServer
) -> None:
    runtime.run(store.put_stream("k", _chunks(_data(3 * MiB), MiB)))
    fresh = GCSStore("b", config=store.config)  # never saw the old pointer
    new = _data(3 * MiB, seed=29)
    try:
        runtime.run(fresh.put_stream("k", _chunks(new, MiB)))
    finally:
        runtime.run(fresh.close())
    assert len([n for n in server.storage.objects if n.startswith(POINTER_PREFIX)]) == 1
    # The first store remembers the deleted data object: it asks the name again.
    assert runtime.run(store.get("k")) == new


def test_stream_yields_the_object(store: GCSStore, server: FakeServer) -> None:
    data = _data(9 * MiB + 3, seed=23)
    server.put("s", data)

    async def collect() -> bytes:
        return b"".join([c async for c in store.stream("s", start=7, chunk_size=4 * MiB)])

    assert runtime.run(collect()) == data[7:]


@pytest.mark.parametrize("operation", ["compose", "copy", "multipart"])
def test_what_a_zonal_bucket_lacks_is_refused(store: GCSStore, operation: str) -> None:
    runtime.run(store.put("src", b"x"))
    info = runtime.run(store.head("src"))
    call = {
        "compose": lambda: store.compose("dst", [info]),
        "copy": lambda: store.copy("src", "dst"),
        "multipart": lambda: store.multipart_initiate("dst"),
    }[operation]
    with pytest.raises(StorageError) as caught:
        runtime.run(call())
    assert caught.value.status == 501
    assert not store.unchecked_multipart_assembly


def test_requests_are_counted_under_the_http_names(store: GCSStore) -> None:
    with accounting.tally_requests({}) as tally:
        runtime.run(store.put("n", b"abc"))
        runtime.run(store.get("n"))
        runtime.run(store.head("n"))
        runtime.run(store.delete("n"))
    assert tally == {"put": 1, "get": 1, "head": 2, "delete": 1}


def test_a_child_forked_after_grpc_takes_the_json_api(store: GCSStore) -> None:
    # gRPC hangs in a child forked after its parent used it; the child must not try.
    runtime.run(store.put("f", b"parent"))
    if os.fork() == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if runtime.run(store._router.grpc(), timeout=20) is None else 2
        finally:
            os._exit(code)
    _, status = os.wait()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_spawned_process_opens_its_own_channel(store: GCSStore, server: FakeServer) -> None:
    runtime.run(store.put("sp", b"parent"))
    script = (
        "import pickle, sys; from torchbucket import runtime; "
        "s = pickle.loads(sys.stdin.buffer.read()); "
        "sys.exit(0 if runtime.run(s.get('sp'), timeout=20) == b'parent' else 2)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=pickle.dumps(store), timeout=60, check=False
    )
    assert done.returncode == 0


@pytest.mark.parametrize(("resource", "zonal"), [('{"locationType": "zone"}', True), ("{}", False)])
def test_auto_asks_the_bucket_once(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch, resource: str, zonal: bool
) -> None:
    from torchbucket.storage.gcs import _layout

    monkeypatch.setattr(_layout, "_cache", {})
    config = GCSConfig(
        endpoint="http://127.0.0.1:9", anonymous=True, grpc_endpoint=f"http://{server.target}"
    )
    stores = [GCSStore("b", config=config) for _ in range(2)]
    asked: list[str] = []

    async def request(method: str, url: object, **kw: object) -> tuple[int, dict[str, str], bytes]:
        asked.append(str(url))
        return 200, {}, resource.encode()

    for s in stores:
        monkeypatch.setattr(s._transport, "request", request)
    assert [runtime.run(s.zonal()) for s in stores] == [zonal, zonal]
    assert len(asked) == 1 and "locationType" in asked[0]
    assert stores[0].unchecked_multipart_assembly is not zonal


def test_auto_on_an_emulator_without_grpc_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHBUCKET_GCS_GRPC_ENDPOINT", raising=False)
    s = GCSStore("b", config=GCSConfig(endpoint="http://127.0.0.1:9", anonymous=True))

    async def request(*args: object, **kw: object) -> None:
        raise AssertionError("no request expected")

    monkeypatch.setattr(s._transport, "request", request)
    assert runtime.run(s.zonal()) is False


def test_data_objects_are_hidden_from_listings() -> None:
    from torchbucket.storage.base import HIDDEN_PREFIXES

    assert POINTER_PREFIX in HIDDEN_PREFIXES


def test_a_zonal_bucket_without_grpcio_says_so_and_takes_the_json_api(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torchbucket.storage.gcs import _grpc_wire, _layout, _route

    monkeypatch.setattr(_layout, "_cache", {})
    monkeypatch.setattr(_route, "_warned", set())
    monkeypatch.setattr(_grpc_wire, "available", lambda: False)
    config = GCSConfig(
        endpoint="http://127.0.0.1:9", anonymous=True, grpc_endpoint=f"http://{server.target}"
    )
    s = GCSStore("b", config=config)

    async def request(method: str, url: object, **kw: object) -> tuple[int, dict[str, str], bytes]:
        return 200, {}, b'{"locationType": "zone"}'

    monkeypatch.setattr(s._transport, "request", request)
    assert runtime.run(s._router.grpc()) is None
    assert runtime.run(s.zonal())  # still zonal: compose stays off
    assert any("torchbucket[rapid]" in r.getMessage() for r in caplog.records)


def test_a_ranged_read_gives_the_crc32c_of_its_bytes(store: GCSStore, server: FakeServer) -> None:
    # From the chunks' own checksums, each checked on arrival: a checkpoint load
    # combines them into the object's instead of reading the download again.
    data = _data(5 * MiB + 3, seed=29)
    runtime.run(store.put_stream("r", _chunks(data, MiB)))
    buf = bytearray(3 * MiB)
    count, crc = runtime.run(store.get_into_checked("r", memoryview(buf), start=MiB))
    assert count == len(buf) and bytes(buf) == data[MiB : 4 * MiB]
    assert crc == crc32c.extend(0, data[MiB : 4 * MiB])
