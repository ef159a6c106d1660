"""``storage.gcs._resume.ResumingStream``: the one resume-on-break loop of GCS streams.

A local aiohttp server serves an object's bytes as asked (``Range``), cutting
the connection after a few bytes while told to; the stream must resume from
the byte it reached, pinned to the first answer's generation, and give up
after ``MAX_RESUMES`` resumes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yarl
from aiohttp import web
from http_helper import local_server

from torchbucket import runtime
from torchbucket.config import RetryConfig
from torchbucket.errors import IntegrityError, StorageError
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.gcs._resume import MAX_RESUMES, ResumingStream

DATA = bytes(range(256)) * 40  # 10,240 bytes


@dataclass
class Server:
    """Serves DATA; the first ``breaks`` answers stop after ``cut`` bytes of body."""

    breaks: int = 0
    cut: int = 1000
    ignore_range: bool = False
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (query, Range)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        wanted = request.headers.get("Range")
        self.seen.append((request.query_string, wanted))
        first, last = 0, len(DATA) - 1
        if wanted and not self.ignore_range:
            lo, _, hi = wanted[len("bytes=") :].partition("-")
            first, last = int(lo), (int(hi) if hi else len(DATA) - 1)
        headers = {"x-goog-generation": "7", "x-goog-hash": "crc32c=AAAAAA=="}
        if wanted and not self.ignore_range:
            headers["Content-Range"] = f"bytes {first}-{last}/{len(DATA)}"
        resp = web.StreamResponse(
            status=206 if "Content-Range" in headers else 200, headers=headers
        )
        resp.content_length = last + 1 - first
        await resp.prepare(request)
        body = DATA[first : last + 1]
        if self.breaks:
            self.breaks -= 1
            await resp.write(body[: self.cut])
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(body)
        return resp


@pytest.fixture
def served() -> Iterator[tuple[Server, GCSStore]]:
    server = Server()
    retry = RetryConfig(initial_backoff=0.0, max_backoff=0.01, deadline=10.0, read_timeout=2.0)
    with local_server(server.handle) as endpoint:
        store = GCSStore("bkt", config=GCSConfig(endpoint=endpoint, retry=retry))
        yield server, store
        runtime.run(store.close())


def _read(store: GCSStore, start: int, end: int | None, **kw: Any) -> tuple[bytes, ResumingStream]:
    transport = store._transport

    def url_for(generation: int | None) -> yarl.URL:
        query = "alt=media" + ("" if generation is None else f"&generation={generation}")
        return transport.urls.object_url("obj", query)

    async def collect() -> tuple[bytes, ResumingStream]:
        reader = ResumingStream(transport, url_for, store.uri("obj"), start, end, **kw)
        async with contextlib.aclosing(reader.chunks(256)) as chunks:
            return b"".join([c async for c in chunks]), reader

    return runtime.run(collect())  # type: ignore[no-any-return]


@pytest.mark.parametrize(("start", "end"), [(0, None), (100, None), (100, 9000)])
def test_a_broken_read_resumes_from_the_byte_it_reached(
    served: tuple[Server, GCSStore], start: int, end: int | None
) -> None:
    server, store = served
    server.breaks = 2
    data, reader = _read(store, start, end)
    assert data == DATA[start:end]
    assert len(server.seen) == 3
    # Each resume asks from where the bytes stopped, for the first answer's generation.
    assert [q for q, _ in server.seen] == ["alt=media"] + ["alt=media&generation=7"] * 2
    stop = "" if end is None else str(end - 1)
    assert [r for _, r in server.seen[1:]] == [
        f"bytes={start + 1000}-{stop}",
        f"bytes={start + 2000}-{stop}",
    ]
    assert reader.generation == 7
    assert reader.hash_headers is not None


def test_an_answer_that_ignores_range_is_skipped_to_the_byte_wanted(
    served: tuple[Server, GCSStore],
) -> None:
    server, store = served
    server.breaks, server.ignore_range = 1, True
    data, _ = _read(store, 0, None)
    assert data == DATA
    assert len(server.seen) == 2


def test_a_read_that_keeps_breaking_gives_up(served: tuple[Server, GCSStore]) -> None:
    server, store = served
    server.breaks, server.cut = 1000, 10
    with pytest.raises(StorageError):
        _read(store, 0, None)
    assert len(server.seen) == 1 + MAX_RESUMES


def test_check_refuses_an_answer_before_its_body(served: tuple[Server, GCSStore]) -> None:
    _, store = served

    def refuse(headers: Any) -> None:
        raise IntegrityError("not the stored bytes", operation="stream", uri="gs://bkt/obj")

    with pytest.raises(IntegrityError, match="not the stored bytes"):
        _read(store, 0, None, check=refuse)
