"""GCSStore against a scripted HTTP server: what is retried, what is not, and how.

Each test scripts the server's answers in order and then checks both what the
caller got and which requests reached the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from http_helper import local_server

from torchbucket import runtime
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.errors import (
    DeadlineExceededError,
    IntegrityError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
)
from torchbucket.storage.base import Part
from torchbucket.storage.crc32c import crc32c_b64
from torchbucket.storage.gcs import GCSConfig, GCSStore, _credentials, _session

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DATA = b"0123456789" * 100


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Scripted:
    """Answers requests with the next scripted handler, and records them."""

    handlers: list[Handler] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        assert self.handlers, f"unscripted request {request.method} {request.path_qs}"
        return await self.handlers.pop(0)(request)

    def methods(self) -> list[str]:
        return [s.method for s in self.seen]


def answer(status: int, body: bytes | dict[str, Any] = b"", **headers: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        return web.Response(status=status, body=data, headers=headers)

    return handler


def media(data: bytes, crc: str | None = None) -> Handler:
    return answer(200, data, **{"x-goog-hash": f"crc32c={crc or crc32c_b64(data)}"})


def resource(name: str, data: bytes, generation: int = 5) -> dict[str, Any]:
    return {
        "name": name,
        "size": str(len(data)),
        "generation": str(generation),
        "crc32c": crc32c_b64(data),
    }


@pytest.fixture
def server() -> Iterator[tuple[Scripted, GCSStore]]:
    scripted = Scripted()
    retry = RetryConfig(
        initial_backoff=0.0, max_backoff=0.01, deadline=10.0, max_attempts=4, read_timeout=0.3
    )
    with local_server(scripted.handle) as endpoint:
        # No hedges: each test scripts every request the server answers, and a
        # new hedger may send a second GET for a read still running after 0.2 s.
        config = GCSConfig(endpoint=endpoint, retry=retry, hedge=HedgeConfig(enabled=False))
        store = GCSStore("bkt", config=config)
        yield scripted, store
        runtime.run(store.close())


def test_a_read_is_retried_after_throttling_and_server_errors(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(503, **{"Retry-After": "0"}), answer(500), media(DATA)]
    assert runtime.run(store.get("k")) == DATA
    assert scripted.methods() == ["GET"] * 3
    assert scripted.seen[0].path_qs == "/storage/v1/b/bkt/o/k?alt=media"


def test_a_corrupted_body_is_retried_then_reported(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [media(DATA, crc="AAAAAA=="), media(DATA)]
    assert runtime.run(store.get("k")) == DATA
    scripted.handlers += [media(DATA, crc="AAAAAA==")] * 4
    # A mismatch that persists is reported as what it is, not as a deadline.
    with pytest.raises(IntegrityError) as info:
        runtime.run(store.get("k"))
    assert isinstance(info.value.__cause__, IntegrityError)
    assert "gs://bkt/k" in str(info.value)
    assert "gave up after 4 attempts" in str(info.value)
    assert len(scripted.seen) == 2 + 4


def test_a_short_range_is_an_integrity_error(server: Any) -> None:
    scripted, store = server
    short = answer(206, DATA[10:15], **{"Content-Range": f"bytes 10-19/{len(DATA)}"})
    scripted.handlers += [short, answer(206, DATA[10:20], **{"Content-Range": "bytes 10-19/1000"})]
    assert runtime.run(store.get("k", start=10, end=20)) == DATA[10:20]
    assert scripted.seen[0].headers["Range"] == "bytes=10-19"


def test_not_found_and_forbidden_are_not_retried(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(404), answer(403)]
    with pytest.raises(NotFoundError):
        runtime.run(store.get("k"))
    with pytest.raises(PermissionDeniedError):
        runtime.run(store.head("k"))
    assert len(scripted.seen) == 2


def test_a_write_without_precondition_is_repeated_pinned_to_the_generation_seen(
    server: Any,
) -> None:
    scripted, store = server
    scripted.handlers += [
        answer(503),
        answer(200, resource("k", b"old", generation=3)),  # the HEAD: not what was sent
        answer(200, resource("k", b"data", generation=4)),
    ]
    info = runtime.run(store.put("k", b"data"))
    assert (info.size, info.generation) == (4, 4)
    assert scripted.methods() == ["POST", "GET", "POST"]
    assert "ifGenerationMatch" not in scripted.seen[0].path_qs
    assert "ifGenerationMatch=3" in scripted.seen[2].path_qs


def test_a_write_without_precondition_whose_answer_was_lost_is_recognised(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(500), answer(200, resource("k", b"data", generation=9))]
    info = runtime.run(store.put("k", b"data"))
    assert info.generation == 9
    assert scripted.methods() == ["POST", "GET"]


def test_a_write_refused_with_429_is_repeated_without_a_head(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(429), answer(200, resource("k", b"data"))]
    runtime.run(store.put("k", b"data"))
    assert scripted.methods() == ["POST", "POST"]
    assert "ifGenerationMatch" not in scripted.seen[1].path_qs


def test_a_conditional_write_accepts_its_own_lost_attempt(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(503), answer(412), answer(200, resource("k", b"data"))]
    info = runtime.run(store.put("k", b"data", if_generation_match=0))
    assert (info.name, info.size, info.generation) == ("k", 4, 5)
    assert scripted.methods() == ["POST", "POST", "GET"]
    assert "ifGenerationMatch=0" in scripted.seen[0].path_qs


def test_a_conditional_write_lost_to_another_writer_fails(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(503), answer(412), answer(200, resource("k", b"other"))]
    with pytest.raises(PreconditionFailedError):
        runtime.run(store.put("k", b"data", if_generation_match=0))


def test_a_first_412_is_final(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(412)]
    with pytest.raises(PreconditionFailedError):
        runtime.run(store.put("k", b"data", if_generation_match=0))
    assert scripted.methods() == ["POST"]


def test_a_retried_delete_that_finds_nothing_succeeded(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(503), answer(404)]
    runtime.run(store.delete("k", generation=3))
    assert scripted.methods() == ["DELETE", "DELETE"]
    assert scripted.seen[0].path_qs.endswith("?generation=3")


def test_a_retried_multipart_complete_accepts_the_finished_object(server: Any) -> None:
    scripted, store = server
    no_upload = b"<Error><Code>NoSuchUpload</Code><Message>gone</Message></Error>"
    obj = resource("k", b"x" * 7)
    scripted.handlers += [
        answer(
            200,
            b"<InitiateMultipartUploadResult><UploadId>u1</UploadId></InitiateMultipartUploadResult>",
        ),
        answer(200, ETag='"e1"'),
        answer(502),
        answer(404, no_upload),
        answer(200, obj),
        answer(200, obj),
    ]
    upload_id = runtime.run(store.multipart_initiate("k"))
    part = runtime.run(store.multipart_upload_part("k", upload_id, 1, b"x" * 7))
    assert part == Part(1, '"e1"')
    info = runtime.run(store.multipart_complete("k", upload_id, [part]))
    assert info.size == 7
    assert [s.path_qs for s in scripted.seen[:3]] == [
        "/bkt/k?uploads",
        "/bkt/k?partNumber=1&uploadId=u1",
        "/bkt/k?uploadId=u1",
    ]
    assert b"<PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag>" in scripted.seen[2].body or (
        b'<PartNumber>1</PartNumber><ETag>"e1"</ETag>' in scripted.seen[2].body
    )


def test_a_stalled_server_is_a_timeout_not_a_hang(server: Any) -> None:
    scripted, store = server

    async def stall(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(2)
        return web.Response(body=b"late")

    scripted.handlers += [stall] * 4
    with pytest.raises(DeadlineExceededError, match="4 attempts"):
        runtime.run(store.get("k"))


def _trickle(pause: float, pieces: int) -> Handler:
    """Headers at once, then the body in ``pieces`` parts ``pause`` seconds apart."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"x-goog-hash": f"crc32c={crc32c_b64(DATA)}"})
        resp.content_length = len(DATA)
        await resp.prepare(request)
        step = -(-len(DATA) // pieces)
        for i in range(0, len(DATA), step):
            await resp.write(DATA[i : i + step])
            await asyncio.sleep(pause)
        return resp

    return handler


def test_a_body_that_stops_midway_is_a_read_timeout(server: Any) -> None:
    scripted, store = server  # read_timeout=0.3
    scripted.handlers += [_trickle(2.0, 2)] * 4
    with pytest.raises(DeadlineExceededError, match="4 attempts") as info:
        runtime.run(store.get("k"))
    assert "read timeout" in str(info.value.__cause__)


def test_a_slow_body_that_keeps_coming_is_not_cut_short(server: Any) -> None:
    scripted, store = server  # read_timeout=0.3: the whole body takes 0.8 s
    scripted.handlers += [_trickle(0.1, 8)]
    assert runtime.run(store.get("k")) == DATA
    assert len(scripted.seen) == 1


def test_a_stream_resumes_where_the_connection_broke(server: Any) -> None:
    scripted, store = server
    half = len(DATA) // 2

    async def broken(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"x-goog-generation": "42"})
        resp.content_length = len(DATA)
        await resp.prepare(request)
        await resp.write(DATA[:half])
        assert request.transport is not None
        request.transport.close()
        return resp

    async def rest(request: web.Request) -> web.StreamResponse:
        # The client may not have seen any of the first half: answer what it asks.
        first = int(request.headers.get("Range", "bytes=0-")[6:].rstrip("-"))
        return web.Response(
            status=206,
            body=DATA[first:],
            headers={
                "Content-Range": f"bytes {first}-{len(DATA) - 1}/{len(DATA)}",
                "x-goog-hash": f"crc32c={crc32c_b64(DATA)}",
            },
        )

    scripted.handlers += [broken, rest]

    async def collect() -> bytes:
        return b"".join([c async for c in store.stream("k", chunk_size=64)])

    assert runtime.run(collect()) == DATA
    assert len(scripted.seen) == 2
    assert "generation=42" in scripted.seen[1].path_qs


def test_credentials_are_sent_but_never_shown(
    server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scripted, store = server

    class FakeCredentials:
        token = "ya29.SECRET-TOKEN"
        valid = True

    import google.auth

    monkeypatch.setattr(google.auth, "default", lambda scopes: (FakeCredentials(), "proj"))
    monkeypatch.setattr(_credentials, "_shared_credentials", {})
    endpoint = store.endpoint
    authed = GCSStore(
        "bkt",
        config=GCSConfig(endpoint=endpoint, anonymous=False, retry=RetryConfig(max_attempts=2)),
    )
    scripted.handlers += [answer(401, b"bad token"), answer(503), answer(503)]
    caplog.set_level(logging.DEBUG, logger="torchbucket")
    for _ in range(2):
        with pytest.raises((PermissionDeniedError, DeadlineExceededError)) as info:
            runtime.run(authed.get("k"))
        assert "SECRET" not in str(info.value)
        assert "SECRET" not in repr(info.value.__cause__)
    assert scripted.seen[0].headers["Authorization"] == "Bearer ya29.SECRET-TOKEN"
    assert scripted.seen[0].headers["User-Agent"].startswith("torchbucket/")
    assert "SECRET" not in caplog.text
    assert "SECRET" not in repr(authed)
    runtime.run(authed.close())


def test_missing_bucket_on_listing(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [answer(404, {"error": {"code": 404, "message": "Not Found"}})]
    with pytest.raises(NotFoundError) as info:
        runtime.run(store.list_page("p/"))
    assert type(info.value).__name__ == "BucketNotFoundError"
    assert "gs://bkt/p/" in str(info.value)


def test_close_releases_the_pool_and_the_store_opens_it_again(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    scripted, store = server
    other = GCSStore("bkt", config=store.config)
    scripted.handlers += [media(DATA)] * 4
    assert runtime.run(store.get("k")) == DATA
    assert runtime.run(other.get("k")) == DATA
    runtime.run(store.close())
    assert runtime.run(other.get("k")) == DATA  # the shared pool is still open for it
    runtime.run(other.close())
    assert runtime.run(store.get("k")) == DATA  # usable again after close

    async def own_loop() -> bytes:
        data: bytes = await other.get("k")
        await other.close()
        return data

    pools = len(_session._sessions)
    caplog.set_level(logging.ERROR, logger="asyncio")
    scripted.handlers += [media(DATA)] * 2
    # Two loops one after the other: the store never reuses a dead loop's pool.
    assert asyncio.run(own_loop()) == DATA
    assert asyncio.run(own_loop()) == DATA
    assert len(_session._sessions) == pools  # each loop's pool was closed with it
    assert "Unclosed" not in caplog.text


def test_missing_credentials_say_where_to_look_and_name_the_uri(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted, store = server
    import google.auth
    import google.auth.exceptions

    def no_credentials(scopes: Any) -> Any:
        raise google.auth.exceptions.DefaultCredentialsError(
            "Your default credentials were not found."
        )

    monkeypatch.setattr(google.auth, "default", no_credentials)
    monkeypatch.setattr(_credentials, "_shared_credentials", {})
    authed = GCSStore("bkt", config=GCSConfig(endpoint=store.endpoint, anonymous=False))
    with pytest.raises(PermissionDeniedError) as info:
        runtime.run(authed.get("k"))
    message = str(info.value)
    assert "gs://bkt/k" in message
    assert "default credentials were not found" in message
    assert "STORAGE_EMULATOR_HOST" in message
    assert scripted.seen == []  # nothing was sent without credentials


def test_the_project_goes_with_every_request(server: Any) -> None:
    scripted, store = server
    billed = GCSStore("bkt", config=GCSConfig(endpoint=store.endpoint, project="payer-1"))
    scripted.handlers += [media(DATA), answer(200, {"items": []})]
    runtime.run(billed.get("k"))
    runtime.run(billed.list_page())
    assert [s.headers.get("x-goog-user-project") for s in scripted.seen] == ["payer-1"] * 2
    runtime.run(billed.close())


def _uploads_page(*uploads: tuple[str, str, float]) -> bytes:
    items = "".join(
        f"<Upload><Key>{key}</Key><UploadId>{upload_id}</UploadId>"
        f"<Initiated>{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(when))}.000Z</Initiated>"
        "</Upload>"
        for key, upload_id, when in uploads
    )
    return f"<ListMultipartUploadsResult>{items}</ListMultipartUploadsResult>".encode()


def test_an_initiate_whose_answer_was_lost_aborts_the_upload_it_began(server: Any) -> None:
    scripted, store = server
    now = time.time()
    scripted.handlers += [
        answer(200, b"<InitiateMultipartUploadResult><UploadId>lo"),  # cut short: lost
        answer(
            200,
            b"<InitiateMultipartUploadResult><UploadId>B</UploadId>"
            b"</InitiateMultipartUploadResult>",
        ),
        answer(
            200,
            _uploads_page(
                ("ckpt", "A", now),  # what the lost answer began
                ("ckpt", "B", now),  # the one returned
                ("ckpt", "old", now - 3600),  # someone else's, from before
                ("ckpt.tmp", "other-key", now),  # another key under the prefix
            ),
        ),
        answer(204),
    ]
    assert runtime.run(store.multipart_initiate("ckpt")) == "B"
    assert scripted.methods() == ["POST", "POST", "GET", "DELETE"]
    assert scripted.seen[3].path_qs == "/bkt/ckpt?uploadId=A"


def test_an_initiate_answered_at_once_lists_nothing(server: Any) -> None:
    scripted, store = server
    scripted.handlers += [
        answer(
            200,
            b"<InitiateMultipartUploadResult><UploadId>B</UploadId>"
            b"</InitiateMultipartUploadResult>",
        ),
    ]
    assert runtime.run(store.multipart_initiate("ckpt")) == "B"
    assert scripted.methods() == ["POST"]
