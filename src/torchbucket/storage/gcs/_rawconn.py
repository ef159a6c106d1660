"""One keep-alive HTTP/1.1 connection that receives a ranged GET into a buffer.

The protocol half of :mod:`torchbucket.storage.gcs._rawget` (which says why
these reads do not go through aiohttp): an :class:`asyncio.BufferedProtocol`
whose ``get_buffer`` hands asyncio the destination slice itself, so the body of
a 206 lands where it belongs with one copy. It parses the header block, and
ends an exchange as ``DONE``, ``FALLBACK`` (an answer it does not read, such
as a chunked or a content-encoded one: the caller repeats the request through
aiohttp) or
``TOO_LONG`` (a body longer than the range asked for).
"""

from __future__ import annotations

import asyncio

from multidict import CIMultiDict

__all__ = ["DONE", "FALLBACK", "TOO_LONG", "Connection", "content_length"]

_HEAD_START = 16 << 10
_HEAD_LIMIT = 64 << 10
_ERROR_BODY_LIMIT = 1 << 20

# A connection's state: between exchanges, reading the header block, reading a body.
_IDLE, _HEAD, _BODY = 0, 1, 2
# How an exchange ended, besides an exception.
DONE, FALLBACK, TOO_LONG = "done", "fallback", "too long"


class Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; receives one answer at a time into a given buffer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self.received = 0
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        self._error: memoryview | None = None
        self._head = bytearray(_HEAD_START)
        self._head_len = 0
        self._state = _IDLE
        self._dest: memoryview | None = None
        self._body: memoryview | None = None
        self._body_len = 0
        self._got = 0
        self._waiter: asyncio.Future[str] | None = None

    # ---------------------------------------------------------- one exchange

    def send(self, request: bytes, dest: memoryview) -> asyncio.Future[str]:
        """Send ``request``; a 206's body goes to ``dest``. The future says how it ended."""
        assert self.transport is not None and self._state == _IDLE
        self._waiter = asyncio.get_running_loop().create_future()
        self._dest = dest
        self._state = _HEAD
        self._head_len = 0
        self.received = 0
        self.reusable = False
        self.transport.write(request)
        return self._waiter

    def abort(self) -> None:
        """Drop the connection at once; nothing more is written into any buffer."""
        self._release()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self._release()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _release(self) -> None:
        self._state = _IDLE
        self._dest = self._body = None

    def _end(self, outcome: str) -> None:
        self._release()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(outcome)

    def _fail(self, exc: BaseException) -> None:
        self._release()
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    # ---------------------------------------------------------- asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the server closed the connection"))

    def eof_received(self) -> bool:
        self._fail(ConnectionResetError("the server closed the connection"))
        return False

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == _BODY:
            assert self._body is not None
            return self._body[self._got :]
        if self._state == _HEAD:
            if self._head_len == len(self._head):
                self._head.extend(bytes(len(self._head)))
            return memoryview(self._head)[self._head_len :]
        # Between answers (the SSL transport asks whenever it may have more):
        # whatever lands here was not asked for, see buffer_updated.
        return memoryview(self._head)[:_HEAD_START]

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self._state == _BODY:
            self._got += nbytes
            if self._got >= self._body_len:
                self._end(DONE)
        elif self._state == _HEAD:
            before = self._head_len
            self._head_len += nbytes
            self._parse_head(max(0, before - 3))
        elif nbytes:
            self.reusable = False  # bytes nobody asked for: the stream is out of step

    # ---------------------------------------------------------- the header block

    def _parse_head(self, search_from: int) -> None:
        end = self._head.find(b"\r\n\r\n", search_from, self._head_len)
        if end < 0:
            if self._head_len >= _HEAD_LIMIT:
                self._end(FALLBACK)
            return
        lines = self._head[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit() or rest[3:4] not in ("", " "):
            self._end(FALLBACK)  # aiohttp's parser says what is wrong
            return
        status = self.status = int(code)
        headers = self.headers = CIMultiDict()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self._end(FALLBACK)
                return
            headers.add(name, value.strip())
        length = content_length(headers)
        if (
            length is None
            or "Transfer-Encoding" in headers
            # A gzip object's stored bytes: a range of them is no range of the
            # object, and they must be decoded (see _gzip).
            or headers.get("Content-Encoding", "identity").lower() != "identity"
            or (status != 206 and (status < 300 or status == 304))
            or (status >= 300 and length > _ERROR_BODY_LIMIT)
        ):
            self._end(FALLBACK)
            return
        connection = headers.get("Connection", "").lower()
        self.reusable = version == "HTTP/1.1" and "close" not in connection
        if status == 206:
            assert self._dest is not None
            if length > len(self._dest):
                self._end(TOO_LONG)
                return
            body = self._dest[:length]
        else:
            body = self._error = memoryview(bytearray(length))
        # The first read may have brought the start of the body along.
        extra = self._head_len - (end + 4)
        if extra > length:
            self.reusable = False  # more than the body: the stream is out of step
            extra = length
        body[:extra] = self._head[end + 4 : end + 4 + extra]
        self._body, self._body_len, self._got = body, length, extra
        self._state = _BODY
        if extra >= length:
            self._end(DONE)

    def take_error_body(self) -> bytes:
        """The body of an error answer (empty for a 206)."""
        view, self._error = self._error, None
        return b"" if view is None else bytes(view)


def content_length(headers: CIMultiDict[str]) -> int | None:
    values = headers.getall("Content-Length", [])
    if len(set(values)) != 1 or not values[0].isdigit():
        return None
    return int(values[0])
