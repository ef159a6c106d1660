"""The emulator's gRPC API (google.storage.v2) against google-cloud-storage's asyncio client, unchanged.

The client is pointed at the emulator as a test would point it at any
endpoint without TLS: ``AsyncGrpcClient(credentials=AnonymousCredentials(),
client_options=ClientOptions(api_endpoint=emu.grpc_endpoint))`` (the client
then opens an insecure channel). Objects go in over one API and come out over
the other: gRPC and the JSON API share the model store.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

google_crc32c = pytest.importorskip("google_crc32c")
pytest.importorskip("grpc")
_asyncio = pytest.importorskip("google.cloud.storage.asyncio.async_grpc_client")
from google.api_core import exceptions as gexc  # noqa: E402
from google.api_core.client_options import ClientOptions  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402
from google.cloud import _storage_v2 as v2  # noqa: E402
from google.cloud.storage.asyncio.async_appendable_object_writer import (  # noqa: E402
    AsyncAppendableObjectWriter,
)
from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient  # noqa: E402
from google.cloud.storage.asyncio.async_multi_range_downloader import (  # noqa: E402
    AsyncMultiRangeDownloader,
)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture(autouse=True)
def _no_faults(emu: Emulator) -> Iterator[None]:
    yield
    emu.clear_faults()


def _bucket(emu: Emulator, *, zonal: bool = True) -> str:
    name = f"z-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=zonal)
    return name


def _client(emu: Emulator) -> AsyncGrpcClient:
    assert emu.grpc_endpoint is not None
    return AsyncGrpcClient(
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=emu.grpc_endpoint),
    )


def _http(
    emu: Emulator, method: str, path: str, body: bytes | None = None, ctype: str = ""
) -> tuple[int, bytes]:
    req = urllib.request.Request(emu.endpoint + path, data=body, method=method)
    if ctype:
        req.add_header("Content-Type", ctype)
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _upload(emu: Emulator, bucket: str, name: str, data: bytes) -> dict[str, Any]:
    status, body = _http(
        emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}", data
    )
    assert status == 200, body
    return dict(json.loads(body))


def _json_read(emu: Emulator, bucket: str, name: str) -> tuple[bytes, dict[str, Any]]:
    status, data = _http(emu, "GET", f"/storage/v1/b/{bucket}/o/{name}?alt=media")
    assert status == 200, data
    status, meta = _http(emu, "GET", f"/storage/v1/b/{bucket}/o/{name}")
    assert status == 200, meta
    return data, dict(json.loads(meta))


def _crc_b64(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def test_multi_range_downloader_reads_ranges_of_an_object_written_over_json(emu: Emulator) -> None:
    b = _bucket(emu)
    data = os.urandom(5_000_000)
    _upload(emu, b, "d/obj.bin", data)
    emu.reset_stats()

    async def body() -> list[bytes]:
        mrd = await AsyncMultiRangeDownloader.create_mrd(_client(emu), b, "d/obj.bin")
        assert mrd.persisted_size == len(data)
        bufs = [io.BytesIO() for _ in range(4)]
        await mrd.download_ranges(
            [
                (0, 100, bufs[0]),
                (1000, 3_000_000, bufs[1]),
                (4_999_990, 0, bufs[2]),  # to the end
                (0, 0, bufs[3]),  # the whole object (checked against its CRC32C)
            ]
        )
        await mrd.close()
        return [buf.getvalue() for buf in bufs]

    got = asyncio.run(body())
    assert got == [data[:100], data[1000:3_001_000], data[4_999_990:], data]
    stats = emu.stats()
    assert stats["by_rpc"]["BidiReadObject"] == 1
    assert stats["by_rpc"]["BidiReadObject.ranges"] == 4
    assert stats["by_op"] == {"get": 1}  # one read stream: one class B operation
    assert stats["by_class"]["B"] == 1
    assert stats["bytes_out"] == 100 + 3_000_000 + 10 + len(data)


def test_a_read_stream_is_in_the_counters_while_it_is_still_open(emu: Emulator) -> None:
    # A client that has its bytes may close the stream after it asks the
    # counters (torchbucket's reads do: a test comparing its own counts with the
    # server's found reads missing under load). Counted when admitted, bytes as sent.
    b = _bucket(emu)
    data = os.urandom(300_000)
    _upload(emu, b, "d/open.bin", data)
    emu.reset_stats()

    async def body() -> tuple[bytes, dict[str, Any]]:
        mrd = await AsyncMultiRangeDownloader.create_mrd(_client(emu), b, "d/open.bin")
        buf = io.BytesIO()
        await mrd.download_ranges([(10, 200_000, buf)])
        stats = await asyncio.to_thread(emu.stats)  # the stream is still open
        await mrd.close()
        return buf.getvalue(), stats

    got, stats = asyncio.run(body())
    assert got == data[10:200_010]
    assert stats["by_op"] == {"get": 1}
    assert stats["bytes_out"] == 200_000


def test_appendable_writer_appends_flushes_finalizes_and_json_reads_it(emu: Emulator) -> None:
    b = _bucket(emu)
    part1, part2 = b"hello ", os.urandom(5_000_000)
    emu.reset_stats()

    async def body() -> tuple[int, int, Any]:
        writer = AsyncAppendableObjectWriter(_client(emu), b, "ckpt/app.bin")
        await writer.open()
        await writer.append(part1)
        flushed = await writer.flush()
        await writer.append(part2)
        looked = await writer.state_lookup()  # no flush: only what was persisted
        obj = await writer.close(finalize_on_close=True)
        return flushed, looked, obj

    flushed, looked, obj = asyncio.run(body())
    assert flushed == len(part1)
    assert looked >= len(part1)
    assert obj.size == len(part1) + len(part2)
    assert obj.finalize_time.timestamp() > 0
    data, meta = _json_read(emu, b, "ckpt/app.bin")
    assert data == part1 + part2
    assert meta["crc32c"] == _crc_b64(part1 + part2)
    assert int(meta["generation"]) == obj.generation
    assert emu.stats()["by_op"]["put"] == 1  # one write stream: one class A operation


def test_an_unfinalized_object_is_read_while_it_grows_and_taken_over(emu: Emulator) -> None:
    b = _bucket(emu)

    async def body() -> tuple[bytes, bytes, int]:
        client = _client(emu)
        first = AsyncAppendableObjectWriter(client, b, "log")
        await first.open()
        await first.append(b"abc")
        await first.flush()
        mrd = await AsyncMultiRangeDownloader.create_mrd(client, b, "log")
        seen = io.BytesIO()
        await mrd.download_ranges([(0, 0, seen)])
        await mrd.close()
        # A second writer takes the object over by its generation, as the
        # client reopens one; it resumes at the persisted size.
        second = AsyncAppendableObjectWriter(client, b, "log", generation=first.generation)
        await second.open()
        assert second.persisted_size == 3
        await second.append(b"def")
        await second.flush()
        with pytest.raises(gexc.FailedPrecondition):
            await first.append(b"late")
            await first.flush()
        obj = await second.close(finalize_on_close=True)
        data, _ = _json_read(emu, b, "log")
        return seen.getvalue(), data, obj.size

    seen, data, size = asyncio.run(body())
    assert seen == b"abc"
    assert data == b"abcdef"
    assert size == 6


def test_a_finalized_object_cannot_be_appended_to(emu: Emulator) -> None:
    b = _bucket(emu)

    async def body() -> None:
        client = _client(emu)
        writer = AsyncAppendableObjectWriter(client, b, "done")
        await writer.open()
        await writer.append(b"x")
        obj = await writer.close(finalize_on_close=True)
        again = AsyncAppendableObjectWriter(client, b, "done", generation=obj.generation)
        with pytest.raises(gexc.FailedPrecondition):
            await again.open()

    asyncio.run(body())


def test_appendable_objects_only_in_zonal_buckets(emu: Emulator) -> None:
    b = _bucket(emu, zonal=False)

    async def body() -> None:
        writer = AsyncAppendableObjectWriter(_client(emu), b, "x")
        with pytest.raises(gexc.InvalidArgument, match="zonal"):
            await writer.open()

    asyncio.run(body())


def test_unary_calls_get_list_read_write_delete(emu: Emulator) -> None:
    b = _bucket(emu)
    data = os.urandom(3_000_000)
    _upload(emu, b, "a/1", data)
    _upload(emu, b, "a/2", b"two")
    _upload(emu, b, "b/3", b"three")
    parent = f"projects/_/buckets/{b}"

    async def body() -> None:
        client = _client(emu)
        gapic = client.grpc_client
        meta = await client.get_object(b, "a/1")
        assert meta.size == len(data)
        assert meta.checksums.crc32c == google_crc32c.value(data)
        page = await gapic.list_objects(
            request=v2.ListObjectsRequest(parent=parent, delimiter="/", page_size=1)
        )
        listed = [o.name for o in page.objects] + list(page.prefixes)
        assert listed == ["a/"]
        page = await gapic.list_objects(request=v2.ListObjectsRequest(parent=parent, prefix="a/"))
        assert [o.name for o in page.objects] == ["a/1", "a/2"]
        stream = await gapic.read_object(
            request=v2.ReadObjectRequest(
                bucket=parent, object_="a/1", read_offset=10, read_limit=2_500_000
            )
        )
        got = b""
        async for message in stream:
            assert message.checksummed_data.crc32c == google_crc32c.value(
                message.checksummed_data.content
            )
            got += message.checksummed_data.content
        assert got == data[10:2_500_010]

        async def requests() -> Any:
            spec = v2.WriteObjectSpec(resource=v2.Object(name="w/new", bucket=parent))
            yield v2.WriteObjectRequest(
                write_object_spec=spec,
                write_offset=0,
                checksummed_data=v2.ChecksummedData(
                    content=b"grpc", crc32c=google_crc32c.value(b"grpc")
                ),
                finish_write=True,
            )

        call = await gapic.write_object(requests=requests())  # a client-streaming call
        written = await call
        assert written.resource.size == 4
        await client.delete_object(b, "a/2")
        with pytest.raises(gexc.NotFound):
            await client.get_object(b, "a/2")

    asyncio.run(body())
    assert _json_read(emu, b, "w/new")[0] == b"grpc"
    assert emu.object_names(b) == ["a/1", "b/3", "w/new"]


def test_a_completed_xml_upload_reads_over_grpc_across_its_parts(emu: Emulator) -> None:
    # The model store keeps it as its parts (emulator/_pieces); a read stream's
    # chunks cross them.
    b = _bucket(emu, zonal=False)
    parts = [os.urandom(1_500_000), os.urandom(2_500_001), os.urandom(7)]
    data = b"".join(parts)
    status, started = _http(emu, "POST", f"/{b}/mpu?uploads")
    assert status == 200, started
    upload_id = started.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    rows = ""
    for number, part in enumerate(parts, 1):
        req = urllib.request.Request(
            f"{emu.endpoint}/{b}/mpu?partNumber={number}&uploadId={upload_id}",
            data=part,
            method="PUT",
        )
        with _OPENER.open(req, timeout=30) as resp:
            rows += (
                f"<Part><PartNumber>{number}</PartNumber><ETag>{resp.headers['ETag']}</ETag></Part>"
            )
    done = f"<CompleteMultipartUpload>{rows}</CompleteMultipartUpload>".encode()
    assert _http(emu, "POST", f"/{b}/mpu?uploadId={upload_id}", done)[0] == 200

    async def body() -> tuple[bytes, int]:
        client = _client(emu)
        meta = await client.get_object(b, "mpu")
        stream = await client.grpc_client.read_object(
            request=v2.ReadObjectRequest(
                bucket=f"projects/_/buckets/{b}", object_="mpu", read_offset=1_000_000
            )
        )
        got = b""
        async for message in stream:
            content = message.checksummed_data.content
            assert message.checksummed_data.crc32c == google_crc32c.value(content)
            got += content
        return got, meta.checksums.crc32c

    got, crc = asyncio.run(body())
    assert got == data[1_000_000:]
    assert crc == google_crc32c.value(data)


def test_storage_layout_says_zone_and_hierarchical_for_zonal_buckets(emu: Emulator) -> None:
    from google.cloud import storage_control_v2

    zonal, regional = _bucket(emu), _bucket(emu, zonal=False)

    async def body() -> list[tuple[str, bool]]:
        import grpc

        transport = storage_control_v2.services.storage_control.transports
        channel = grpc.aio.insecure_channel(str(emu.grpc_endpoint))
        client = storage_control_v2.StorageControlAsyncClient(
            transport=transport.StorageControlGrpcAsyncIOTransport(channel=channel)
        )
        out = []
        for name in (zonal, regional):
            layout = await client.get_storage_layout(
                name=f"projects/_/buckets/{name}/storageLayout"
            )
            out.append((layout.location_type, layout.hierarchical_namespace.enabled))
        return out

    assert asyncio.run(body()) == [("zone", True), ("region", False)]
    _, meta = _http(emu, "GET", f"/storage/v1/b/{zonal}")
    assert json.loads(meta)["locationType"] == "zone"


def test_the_cli_serves_grpc_and_makes_zonal_buckets() -> None:
    import subprocess
    import sys

    args = ["--grpc-port", "0", "--zonal-bucket", "rapid", "--bucket", "plain", "--watch-stdin"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchbucket.emulator", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        endpoint = line["grpc_endpoint"]
        assert endpoint == f"127.0.0.1:{line['grpc_port']}"

        async def body() -> list[str]:
            client = AsyncGrpcClient(
                credentials=AnonymousCredentials(),
                client_options=ClientOptions(api_endpoint=endpoint),
            )
            out = []
            for name in ("rapid", "plain"):
                bucket = await client.grpc_client.get_bucket(name=f"projects/_/buckets/{name}")
                out.append(bucket.location_type)
            return out

        assert asyncio.run(body()) == ["zone", "region"]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_bytes_sent_after_the_last_flush_are_lost_with_a_broken_stream(emu: Emulator) -> None:
    # The service persists at a flush, a finish or a clean close; a client may
    # count on nothing beyond the persisted size it was told.
    b = _bucket(emu)
    parent = f"projects/_/buckets/{b}"

    async def body() -> tuple[int, int]:
        client = _client(emu)
        opened: asyncio.Queue[Any] = asyncio.Queue()

        async def requests() -> Any:
            spec = v2.WriteObjectSpec(
                resource=v2.Object(name="half", bucket=parent), appendable=True
            )
            yield v2.BidiWriteObjectRequest(write_object_spec=spec)
            await opened.get()
            chunk = b"persisted"
            yield v2.BidiWriteObjectRequest(
                write_offset=0,
                checksummed_data=v2.ChecksummedData(content=chunk),
                flush=True,
                state_lookup=True,
            )
            yield v2.BidiWriteObjectRequest(
                write_offset=len(chunk), checksummed_data=v2.ChecksummedData(content=b"lost")
            )
            await asyncio.sleep(3600)  # the stream breaks here

        call = await client.grpc_client.bidi_write_object(requests=requests())
        first = await call.read()
        await opened.put(None)
        flushed = await call.read()
        await asyncio.sleep(0.2)  # the unflushed chunk reaches the server
        call.cancel()
        writer = AsyncAppendableObjectWriter(
            client, b, "half", generation=first.resource.generation
        )
        await writer.open()
        size = int(writer.persisted_size or 0)
        await writer.close()  # a clean close: still 9 bytes
        return int(flushed.persisted_size), size

    assert asyncio.run(body()) == (9, 9)
    assert _json_read(emu, b, "half")[0] == b"persisted"
