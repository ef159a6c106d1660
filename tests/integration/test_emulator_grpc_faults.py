"""Zonal buckets' refusals over HTTP, and the gRPC API's faults, auth and latency.

Fault rules name HTTP operations: a bidi read stream's open and each range
it reads count as a ``get`` (so ``nth=2`` hits the first range), a write
stream as one ``put``, ``GetObject`` as a ``head``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from torchbucket.emulator import Emulator, LatencyModel

pytestmark = pytest.mark.emulator

google_crc32c = pytest.importorskip("google_crc32c")
pytest.importorskip("grpc")
pytest.importorskip("google.cloud.storage.asyncio.async_grpc_client")
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
from google.cloud.storage.exceptions import DataCorruption  # noqa: E402

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_MiB = 1 << 20


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture(autouse=True)
def _reset(emu: Emulator) -> Iterator[None]:
    yield
    emu.clear_faults()
    emu.set_latency(None)


def _bucket(emu: Emulator, *, zonal: bool = True) -> str:
    name = f"f-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, zonal=zonal)
    return name


def _client(emu: Emulator) -> AsyncGrpcClient:
    return AsyncGrpcClient(
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=emu.grpc_endpoint),
    )


def _http(
    emu: Emulator,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    req = urllib.request.Request(emu.endpoint + path, data=body, method=method)
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- zonal buckets over HTTP --------------------------------------------------


def test_a_zonal_bucket_refuses_compose_rewrite_copy_and_xml_multipart(emu: Emulator) -> None:
    zonal, regional = _bucket(emu), _bucket(emu, zonal=False)
    for b in (zonal, regional):
        emu.seed(b, {"a": b"aaa", "b": b"bbb"})
    compose = json.dumps({"sourceObjects": [{"name": "a"}, {"name": "b"}]}).encode()
    json_type = {"Content-Type": "application/json"}
    for b, expected in ((zonal, 400), (regional, 200)):
        calls = [
            ("POST", f"/storage/v1/b/{b}/o/c/compose", compose),
            ("POST", f"/storage/v1/b/{b}/o/a/rewriteTo/b/{b}/o/r", b"{}"),
            ("POST", f"/storage/v1/b/{b}/o/a/copyTo/b/{b}/o/k", b"{}"),
        ]
        for method, path, body in calls:
            status, answer = _http(emu, method, path, body, json_type)
            assert status == expected, (path, answer)
            if expected == 400:
                assert "zonal" in json.loads(answer)["error"]["message"].lower()
        status, answer = _http(emu, "POST", f"/{b}/big?uploads", b"")
        assert status == expected, answer
        if expected == 400:
            assert b"<Code>InvalidArgument</Code>" in answer
    # From a regional bucket into a zonal one: refused too.
    status, _ = _http(
        emu, "POST", f"/storage/v1/b/{regional}/o/a/copyTo/b/{zonal}/o/x", b"{}", json_type
    )
    assert status == 400
    assert emu.object_names(zonal) == ["a", "b"]
    # A JSON API bucket insert with the RAPID class makes a zonal bucket.
    name = f"f-{uuid.uuid4().hex[:12]}"
    status, answer = _http(
        emu,
        "POST",
        "/storage/v1/b",
        json.dumps({"name": name, "storageClass": "RAPID"}).encode(),
        json_type,
    )
    assert status == 200 and json.loads(answer)["locationType"] == "zone"


# -- faults on reads ----------------------------------------------------------


def _download(emu: Emulator, b: str, name: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    async def body() -> list[bytes]:
        mrd = await AsyncMultiRangeDownloader.create_mrd(_client(emu), b, name)
        bufs = [io.BytesIO() for _ in ranges]
        try:
            await mrd.download_ranges([(o, n, buf) for (o, n), buf in zip(ranges, bufs)])
        finally:
            if mrd.is_stream_open:
                await mrd.close()
        return [buf.getvalue() for buf in bufs]

    return asyncio.run(body())


def test_a_stream_broken_mid_read_is_resumed_by_the_client(emu: Emulator) -> None:
    b = _bucket(emu)
    data = os.urandom(6 * _MiB)
    emu.seed(b, {"obj": data})
    emu.reset_stats()
    emu.add_fault("get", "truncate", nth=2)  # the first range: half its bytes, then UNAVAILABLE
    assert _download(emu, b, "obj", [(0, 0)]) == [data]
    stats = emu.stats()
    assert stats["faults"] == {"truncate": 1}
    assert stats["by_rpc"]["BidiReadObject"] == 2  # the broken stream and the resumed one
    assert stats["by_status"]["503"] == 1
    assert stats["bytes_out"] == len(data)  # it resumed from the last byte it had


def test_a_corrupted_chunk_fails_the_clients_checksum(emu: Emulator) -> None:
    b = _bucket(emu)
    emu.seed(b, {"obj": os.urandom(3 * _MiB)})
    emu.add_fault("get", "corrupt", nth=2)
    with pytest.raises(DataCorruption, match="Checksum mismatch"):
        _download(emu, b, "obj", [(0, 0)])


def test_status_faults_are_grpc_codes_and_transient_ones_are_retried(emu: Emulator) -> None:
    b = _bucket(emu)
    data = os.urandom(1000)
    emu.seed(b, {"obj": data})
    emu.add_fault("get", "503", nth=2)  # a range fails the stream: UNAVAILABLE, retried
    assert _download(emu, b, "obj", [(10, 20), (500, 0)]) == [data[10:30], data[500:]]

    async def head() -> None:
        await _client(emu).get_object(b, "obj", retry=None)

    for kind, error in (
        ("429", gexc.TooManyRequests),
        ("503", gexc.ServiceUnavailable),
        ("404", gexc.NotFound),
    ):
        emu.add_fault("head", kind)
        with pytest.raises(error):
            asyncio.run(head())
    assert emu.stats()["faults"]["429"] == 1


# -- faults on writes ---------------------------------------------------------


def test_a_stream_broken_mid_write_resumes_from_the_persisted_size(emu: Emulator) -> None:
    b = _bucket(emu)
    data = os.urandom(7 * _MiB)
    emu.reset_stats()
    emu.add_fault("put", "truncate")  # the stream breaks at its first flush, nothing persisted

    async def body() -> Any:
        writer = AsyncAppendableObjectWriter(
            _client(emu), b, "ckpt", writer_options={"FLUSH_INTERVAL_BYTES": 2 * _MiB}
        )
        await writer.open()
        await writer.append(data)
        return await writer.close(finalize_on_close=True)

    obj = asyncio.run(body())
    assert obj.size == len(data)
    status, got = _http(emu, "GET", f"/storage/v1/b/{b}/o/ckpt?alt=media")
    assert status == 200 and got == data
    assert emu.stats()["faults"]["truncate"] == 1


def test_a_chunk_damaged_on_the_way_up_is_refused(emu: Emulator) -> None:
    # A raw stream, so that the refusal is what the client reads: the
    # appendable writer sends its flush as a second message, and a refusal
    # that arrives before that send leaves grpc reporting its own failed send
    # (INTERNAL) instead of the server's status, about one run in ten.
    b = _bucket(emu)
    parent = f"projects/_/buckets/{b}"
    emu.add_fault("put", "corrupt_request")
    chunk = b"some bytes"

    async def body() -> None:
        client = _client(emu)
        opened: asyncio.Queue[Any] = asyncio.Queue()

        async def requests() -> Any:
            spec = v2.WriteObjectSpec(
                resource=v2.Object(name="bad", bucket=parent), appendable=True
            )
            yield v2.BidiWriteObjectRequest(write_object_spec=spec)
            await opened.get()
            yield v2.BidiWriteObjectRequest(
                write_offset=0,
                checksummed_data=v2.ChecksummedData(
                    content=chunk, crc32c=google_crc32c.value(chunk)
                ),
                flush=True,
                state_lookup=True,
            )

        call = await client.grpc_client.bidi_write_object(requests=requests())
        await call.read()
        await opened.put(None)
        await call.read()

    with pytest.raises(gexc.InvalidArgument, match="CRC32C"):
        asyncio.run(body())
    status, got = _http(emu, "GET", f"/storage/v1/b/{b}/o/bad?alt=media")
    assert status == 200 and got == b""  # created at open; the damaged bytes never persisted


# -- latency, auth ------------------------------------------------------------


def test_the_latency_model_applies_to_grpc_calls(emu: Emulator) -> None:
    b = _bucket(emu)
    emu.seed(b, {"obj": b"x"})
    emu.set_latency(
        LatencyModel(
            read=0.0,
            list_page=0.0,
            write=0.0,
            bandwidth=None,
            stall_probability=1.0,
            stall_seconds=0.01,
        )
    )
    emu.reset_stats()

    async def head() -> None:
        await _client(emu).get_object(b, "obj")

    asyncio.run(head())
    assert sum(emu.stats()["stalls"].values()) == 1


def test_auth_mode_checks_the_bearer_token_in_metadata() -> None:
    with Emulator(grpc=True, auth=True) as emu:
        emu.create_bucket("bkt")
        emu.seed("bkt", {"a": b"hello"})
        req = urllib.request.Request(
            f"http://{emu.metadata_host}/computeMetadata/v1/instance/service-accounts/default/token",
            headers={"Metadata-Flavor": "Google"},
        )
        with _OPENER.open(req, timeout=30) as resp:
            token = json.loads(resp.read())["access_token"]

        async def head(metadata: list[tuple[str, str]]) -> int:
            obj = await _client(emu).get_object("bkt", "a", metadata=metadata, retry=None)
            return int(obj.size)

        with pytest.raises(gexc.Unauthenticated):
            asyncio.run(head([]))
        with pytest.raises(gexc.Unauthenticated):
            asyncio.run(head([("authorization", "Bearer nope")]))
        assert asyncio.run(head([("authorization", f"Bearer {token}")])) == 5
        assert emu.auth_stats()["rejected"] == {"missing": 1, "unknown": 1}


def test_read_object_streams_break_and_corrupt_as_bidi_ones_do(emu: Emulator) -> None:
    from google.cloud import _storage_v2 as v2

    b = _bucket(emu)
    data = os.urandom(5 * _MiB)
    emu.seed(b, {"obj": data})
    request = v2.ReadObjectRequest(bucket=f"projects/_/buckets/{b}", object_="obj")

    async def read() -> list[tuple[bytes, int]]:
        stream = await _client(emu).grpc_client.read_object(request=request, retry=None)
        return [(m.checksummed_data.content, m.checksummed_data.crc32c) async for m in stream]

    emu.add_fault("get", "truncate")
    with pytest.raises(gexc.ServiceUnavailable):
        asyncio.run(read())
    emu.add_fault("get", "corrupt")
    chunks = asyncio.run(read())
    assert b"".join(c for c, _ in chunks) != data
    bad = [c for c, crc in chunks if google_crc32c.value(c) != crc]
    assert len(bad) == 1  # the damaged chunk still carries the original's CRC32C


def test_a_new_appendable_object_with_generation_0_fails_if_one_exists(emu: Emulator) -> None:
    b = _bucket(emu)
    emu.seed(b, {"taken": b"x"})

    async def body() -> None:
        writer = AsyncAppendableObjectWriter(_client(emu), b, "taken", generation=0)
        with pytest.raises(gexc.FailedPrecondition):
            await writer.open()

    asyncio.run(body())
