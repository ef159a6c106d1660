"""Every upload request of the GCS store declares the CRC32C of what it sends.

Against a small recording HTTP server that answers the way GCS does: the
requests are read back and their declared checksums compared with the bytes
they carried. A refusal for a checksum mismatch (GCS's 400) is an
``IntegrityError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from torchbucket import runtime
from torchbucket.config import RetryConfig
from torchbucket.errors import IntegrityError
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.crc32c import b64, crc32c_b64, extend
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.memory import MemoryStore

DATA = bytes(range(256)) * 4096  # 1 MiB


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """Answers like GCS (enough for uploads), recording every request."""

    seen: list[Seen] = field(default_factory=list)
    #: Answers to give first, before the normal ones: (status, JSON body).
    refusals: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: A part's answered x-goog-hash, if it must differ from the part's own.
    part_hash: str | None = None
    received: bytearray = field(default_factory=bytearray)
    #: Refuse the request that finalizes a resumable upload, as GCS does when
    #: the declared CRC32C does not match.
    refuse_final: bool = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        if self.refusals:
            status, doc = self.refusals.pop(0)
            return web.json_response(doc, status=status)
        query = request.query
        if "partNumber" in query:
            crc = self.part_hash or crc32c_b64(body)
            return web.Response(headers={"ETag": '"e"', "x-goog-hash": f"crc32c={crc}"})
        if query.get("uploadType") == "resumable" and request.method == "POST":
            location = f"http://{request.host}/upload/session?upload_id=1"
            return web.Response(headers={"Location": location})
        if request.path == "/upload/session":
            if self.refuse_final and "x-goog-hash" in request.headers:
                return web.json_response(REFUSED_JSON, status=400)
            self.received += body
            total = request.headers["Content-Range"].rpartition("/")[2]
            if total == "*":
                return web.Response(
                    status=308, headers={"Range": f"bytes=0-{len(self.received) - 1}"}
                )
            return web.json_response(resource("o", bytes(self.received)))
        if query.get("uploadType") == "multipart":
            return web.json_response(resource("o", media_of(request, body)))
        if request.path.endswith("/compose"):
            return web.json_response(
                {"name": "c", "size": "6", "generation": "1", "crc32c": crc32c_b64(b"garble")}
            )
        raise AssertionError(f"unexpected {request.method} {request.path_qs}")


def resource(name: str, data: bytes) -> dict[str, Any]:
    return {"name": name, "size": str(len(data)), "generation": "7", "crc32c": crc32c_b64(data)}


def media_of(request: web.Request, body: bytes) -> bytes:
    boundary = request.headers["Content-Type"].split("boundary=")[1].encode()
    parts = body.split(b"--" + boundary)
    return parts[2].split(b"\r\n\r\n", 1)[1][: -len(b"\r\n")]


def metadata_of(request_body: bytes) -> dict[str, Any]:
    found = re.search(rb"\r\n\r\n(\{.*?\})\r\n", request_body)
    assert found is not None
    return json.loads(found.group(1))  # type: ignore[no-any-return]


@pytest.fixture
def server() -> Iterator[tuple[Recorder, str]]:
    recorder = Recorder()

    async def start() -> web.AppRunner:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", recorder.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner

    runner = runtime.run(start())
    port = runner.addresses[0][1]
    yield recorder, f"http://127.0.0.1:{port}"
    runtime.run(runner.cleanup())


def store_on(endpoint: str, **options: Any) -> GCSStore:
    retry = RetryConfig(initial_backoff=0.001, max_backoff=0.002, deadline=5.0, max_attempts=4)
    return GCSStore(
        "bkt", config=GCSConfig(endpoint=endpoint, anonymous=True, retry=retry, **options)
    )


def test_a_simple_upload_declares_its_crc32c(server: tuple[Recorder, str]) -> None:
    recorder, endpoint = server
    store = store_on(endpoint)
    runtime.run(store.put("o", DATA[:1000]))
    (seen,) = recorder.seen
    assert metadata_of(seen.body)["crc32c"] == crc32c_b64(DATA[:1000])


def test_a_resumable_upload_declares_the_whole_crc32c_on_its_last_chunk(
    server: tuple[Recorder, str],
) -> None:
    recorder, endpoint = server
    store = store_on(endpoint, max_simple_upload_size=1024, upload_chunk_size=256 * 1024)
    runtime.run(store.put("o", DATA))
    chunks = [s for s in recorder.seen if s.method == "PUT"]
    assert len(chunks) == 4
    assert [c.headers.get("x-goog-hash") for c in chunks[:-1]] == [None, None, None]
    assert chunks[-1].headers["x-goog-hash"] == f"crc32c={crc32c_b64(DATA)}"


def test_a_streamed_upload_declares_the_crc32c_it_learns_at_the_end(
    server: tuple[Recorder, str],
) -> None:
    recorder, endpoint = server
    store = store_on(endpoint, upload_chunk_size=256 * 1024)

    async def chunks() -> Any:
        for start in range(0, len(DATA), 100_000):
            yield DATA[start : start + 100_000]

    info = runtime.run(store.put_stream("o", chunks()))
    assert info.size == len(DATA)
    puts = [s for s in recorder.seen if s.method == "PUT"]
    assert puts[-1].headers["x-goog-hash"] == f"crc32c={crc32c_b64(DATA)}"
    assert all("x-goog-hash" not in p.headers for p in puts[:-1])


def test_each_part_declares_its_crc32c(server: tuple[Recorder, str]) -> None:
    recorder, endpoint = server
    store = store_on(endpoint)
    runtime.run(store.multipart_upload_part("o", "u1", 3, DATA[:5000]))
    (seen,) = recorder.seen
    assert seen.headers["x-goog-hash"] == f"crc32c={crc32c_b64(DATA[:5000])}"


def test_a_part_declares_the_crc32c_its_caller_computed(server: tuple[Recorder, str]) -> None:
    # The checkpoint writer checksums each part once and passes it on: the
    # store declares that value (a changed buffer is then refused by GCS).
    recorder, endpoint = server
    store = store_on(endpoint)
    given = extend(0, DATA[:4000])  # not the CRC32C of the bytes sent
    with pytest.raises(IntegrityError, match="stored with CRC32C"):  # the server's own
        runtime.run(store.multipart_upload_part("o", "u1", 2, DATA[:5000], crc32c=given))
    assert recorder.seen[0].headers["x-goog-hash"] == f"crc32c={b64(given)}"


def test_a_part_of_several_buffers_is_sent_whole_with_its_crc32c(
    server: tuple[Recorder, str],
) -> None:
    recorder, endpoint = server
    store = store_on(endpoint)
    pieces = [
        memoryview(DATA[:300_000]),
        memoryview(DATA[300_000:300_001]),
        memoryview(DATA)[300_001:],
    ]
    runtime.run(store.multipart_upload_part("o", "u1", 1, pieces))
    (seen,) = recorder.seen
    assert seen.body == DATA
    assert seen.headers["x-goog-hash"] == f"crc32c={crc32c_b64(DATA)}"


def test_the_memory_store_refuses_a_part_whose_declared_crc32c_is_wrong() -> None:
    store = MemoryStore("bucket-m")
    upload_id = runtime.run(store.multipart_initiate("o"))
    with pytest.raises(IntegrityError, match="part 1 declares CRC32C"):
        runtime.run(
            store.multipart_upload_part("o", upload_id, 1, DATA[:5000], crc32c=extend(0, b"x"))
        )
    runtime.run(
        store.multipart_upload_part("o", upload_id, 1, DATA[:5000], crc32c=extend(0, DATA[:5000]))
    )


def test_a_part_stored_with_another_crc32c_is_sent_again(server: tuple[Recorder, str]) -> None:
    recorder, endpoint = server
    recorder.part_hash = crc32c_b64(b"something else")
    store = store_on(endpoint)
    with pytest.raises(IntegrityError, match="stored with CRC32C"):
        runtime.run(store.multipart_upload_part("o", "u1", 1, DATA[:5000]))
    assert len(recorder.seen) == 4  # sent again until the attempts ran out


REFUSED_JSON = {
    "error": {
        "code": 400,
        "message": 'Provided CRC32C "AAAAAA==" doesn\'t match calculated CRC32C "2HvlZg==".',
        "errors": [
            {
                "message": 'Provided CRC32C "AAAAAA==" doesn\'t match calculated CRC32C '
                '"2HvlZg==".',
                "domain": "global",
                "reason": "invalid",
            }
        ],
    }
}


def test_a_refused_simple_upload_is_sent_again(server: tuple[Recorder, str]) -> None:
    recorder, endpoint = server
    recorder.refusals.append((400, REFUSED_JSON))
    store = store_on(endpoint)
    info = runtime.run(store.put("o", DATA[:1000]))
    assert info.size == 1000
    assert len(recorder.seen) == 2


def test_a_refused_resumable_upload_is_an_integrity_error(server: tuple[Recorder, str]) -> None:
    recorder, endpoint = server
    recorder.refuse_final = True
    store = store_on(endpoint, max_simple_upload_size=1024, upload_chunk_size=256 * 1024)
    with pytest.raises(IntegrityError, match="doesn't match calculated CRC32C"):
        runtime.run(store.put("o", DATA))
    # Not repeated into a session that is over.
    assert sum(1 for s in recorder.seen if "x-goog-hash" in s.headers) == 1


def test_a_compose_with_a_crc32c_other_than_its_sources_is_an_integrity_error(
    server: tuple[Recorder, str],
) -> None:
    _, endpoint = server
    store = store_on(endpoint)
    sources = [
        ObjectInfo("a", 3, 1, crc32c_b64(b"abc")),
        ObjectInfo("b", 3, 1, crc32c_b64(b"def")),
    ]
    with pytest.raises(IntegrityError, match="sources' combine to"):
        runtime.run(store.compose("c", sources))
