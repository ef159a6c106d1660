"""Resumable uploads, held by the front server for either store.

A session is opened with ``POST /upload/...?uploadType=resumable`` (answered
with a ``Location`` built from the request's ``Host``), fed with ``PUT``s whose
``Content-Range`` is ``bytes a-b/*`` (answered 308 with the ``Range`` received
so far) and finished by one whose total is known (``bytes a-b/N`` or
``bytes */N``). fake-gcs-server's own sessions finish early on a status query
and mis-report ``Range``, so the front server keeps the bytes (as they came,
not joined: see :mod:`._pieces`) and hands the finished object to the store
in one write. The finalizing request's
``x-goog-hash`` and the session's ``crc32c`` / ``md5Hash`` are checked against
the whole object first, as GCS checks them (see :mod:`._hashes`).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from torchbucket.emulator._hashes import check_declared, declared_in_headers, declared_in_metadata
from torchbucket.emulator._http import ApiError, Call
from torchbucket.emulator._pieces import Pieces

__all__ = ["ResumableSessions", "Session"]

# Sessions are forgotten after this long, so a retried final PUT still gets
# the object but abandoned sessions do not pile up.
_SESSION_TTL = 3600.0


class Session:
    """One resumable upload session."""

    __slots__ = ("bucket", "chunks", "done", "meta", "name", "query", "received", "started")

    def __init__(self, bucket: str, name: str, meta: dict[str, Any], query: dict[str, str]) -> None:
        self.bucket = bucket
        self.name = name
        self.meta = meta
        self.query = query
        # The bytes received, as they came (joined by no one: see _pieces).
        self.chunks: list[bytes] = []
        self.received = 0
        self.done: web.Response | None = None
        self.started = time.monotonic()


# finalize(session, data) -> the answer to the final PUT (an object resource).
Finalize = Callable[[Session, bytes | Pieces], Awaitable[web.Response]]
CheckBucket = Callable[[str], Awaitable[None]]


class ResumableSessions:
    """Resumable upload sessions over a store.

    Args:
        finalize: Writes a finished upload; raises :class:`ApiError` or returns
            an error answer when the store refuses it.
        check_bucket: Raises :class:`ApiError` (404) when a bucket is missing.
    """

    def __init__(self, finalize: Finalize, check_bucket: CheckBucket) -> None:
        self.finalize = finalize
        self.check_bucket = check_bucket
        self.sessions: dict[str, Session] = {}

    async def start(self, call: Call) -> web.Response:
        """Open a session; the answer's ``Location`` is where chunks go."""
        meta: dict[str, Any] = {}
        if call.body:
            try:
                meta = json.loads(call.body)
            except ValueError:
                raise ApiError(400, "Request body is not valid JSON.") from None
            if not isinstance(meta, dict):
                raise ApiError(400, "Request body must be a JSON object.")
        name = meta.get("name") or call.query.get("name", "")
        if not name:
            raise ApiError(400, "Required parameter 'name' is missing.")
        bucket = call.route.bucket
        await self.check_bucket(bucket)
        if not meta.get("contentType") and call.headers.get("X-Upload-Content-Type"):
            meta["contentType"] = call.headers["X-Upload-Content-Type"]
        meta["name"] = name
        self._expire()
        upload_id = secrets.token_urlsafe(24)
        query = {k: v for k, v in call.query.items() if k.startswith("if")}
        self.sessions[upload_id] = Session(bucket, name, meta, query)
        location = (
            f"{call.scheme}://{call.host}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
            f"?uploadType=resumable&name={quote(name, safe='')}&upload_id={upload_id}"
        )
        return web.Response(
            status=200, headers={"Location": location, "X-GUploader-UploadID": upload_id}
        )

    def _expire(self) -> None:
        if len(self.sessions) < 256:
            return
        cutoff = time.monotonic() - _SESSION_TTL
        for key in [k for k, s in self.sessions.items() if s.started < cutoff]:
            del self.sessions[key]

    async def chunk(self, call: Call) -> web.Response:
        """Take one ``PUT`` (a chunk, a status query or a cancel ``DELETE``)."""
        upload_id = call.query.get("upload_id", "")
        session = self.sessions.get(upload_id)
        if session is None:
            raise ApiError(404, f"No such upload session {upload_id!r}")
        if call.method == "DELETE":
            del self.sessions[upload_id]
            return web.Response(status=499)
        if session.done is not None:
            return session.done
        first, last, total = content_range(call.headers.get("Content-Range"), len(call.body))
        if first is not None:
            if first > session.received:
                raise ApiError(
                    400,
                    f"Chunk starts at {first} but only {session.received} bytes were received.",
                )
            assert last is not None
            if last - first + 1 != len(call.body):
                raise ApiError(400, "Content-Range does not match the body length.")
            skip = session.received - first  # bytes already received (a retried chunk)
            if skip < len(call.body):
                fresh = call.body[skip:] if skip else call.body
                session.chunks.append(fresh)
                session.received += len(fresh)
        if total is not None and session.received >= total:
            if session.received > total:
                raise ApiError(
                    400, f"Received {session.received} bytes, more than the total {total}."
                )
            data = Pieces.of(session.chunks)
            try:
                # The whole object's checksums: declared in the session's metadata,
                # or on this, the finalizing request (x-goog-hash). A mismatch
                # ends the upload; nothing becomes visible.
                check_declared(declared_in_metadata(session.meta), data)
                check_declared(declared_in_headers(call.headers, xml=False), data)
                resp = await self.finalize(session, data)
            except ApiError:
                del self.sessions[upload_id]
                raise
            if resp.status >= 400:
                del self.sessions[upload_id]
                return resp
            session.done = resp
            session.chunks = []
            return resp
        headers = {"X-GUploader-UploadID": upload_id}
        if session.received:
            headers["Range"] = f"bytes=0-{session.received - 1}"
        return web.Response(status=308, headers=headers)


def content_range(header: str | None, body_len: int) -> tuple[int | None, int | None, int | None]:
    """Parse a resumable chunk's ``Content-Range``.

    Returns:
        ``(first, last, total)``: ``first``/``last`` are ``None`` for ``bytes */N``
        status queries, ``total`` is ``None`` while unknown (``/*``).
    """
    if not header:
        # A single-request upload: the whole body, total known.
        return (0, body_len - 1, body_len) if body_len else (None, None, 0)
    if not header.startswith("bytes "):
        raise ApiError(400, f"Invalid Content-Range {header!r}")
    span, _, total_s = header[6:].partition("/")
    try:
        total = None if total_s == "*" else int(total_s)
        if span == "*":
            return None, None, total
        first_s, _, last_s = span.partition("-")
        return int(first_s), int(last_s), total
    except ValueError:
        raise ApiError(400, f"Invalid Content-Range {header!r}") from None
