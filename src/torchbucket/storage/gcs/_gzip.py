"""Objects stored with ``Content-Encoding: gzip``: read verified, returned decoded.

GCS serves such an object by "decompressive transcoding"
(https://cloud.google.com/storage/docs/transcoding). To a request without
``Accept-Encoding: gzip`` it sends the decompressed bytes, ignores any
``Range`` header ("that header is silently ignored ... the response instead
serves the entire requested object", #range), and its ``x-goog-hash`` still
describes the stored, compressed bytes: nothing checks what arrives. To a
request with ``Accept-Encoding: gzip`` (torchbucket sends it on every read,
as aiohttp does) it serves the stored bytes as they are, with
``Content-Encoding: gzip``, and a ``Range`` applies to them.

So torchbucket reads the stored form, checks its CRC32C like any other read,
and decompresses it here. That is what makes these reads verifiable (GCS has
no hash of the decoded bytes), and it returns what ``google-cloud-storage``'s
``download_as_bytes()`` returns: it too asks for gzip and decodes on the client.

Offsets of a ranged read are offsets into the decoded bytes. The server cannot
serve a range of those (a range of the stored bytes is not one), so such a read
fetches the whole object and cuts the range from it; a stream decodes as it
goes and resumes a broken read at a stored offset. Callers that know from
:attr:`ObjectInfo.transcoded <torchbucket.storage.base.ObjectInfo.transcoded>`
that an object is encoded read it whole, once, instead of by ranges.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

import yarl

from torchbucket.errors import IntegrityError, StorageError
from torchbucket.storage.gcs._resume import ResumingStream
from torchbucket.storage.gcs._wire import (
    crc_b64,
    extend_crc,
    verify_crc32c,
)

if TYPE_CHECKING:
    from torchbucket.storage.gcs._transport import GCSTransport

__all__ = [
    "GzipDecoder",
    "decode_range",
    "gunzip",
    "read_decoded",
    "served_gzip",
    "stream_decoded",
]

logger = logging.getLogger(__name__)

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer, not zlib's


def served_gzip(headers: Mapping[str, str]) -> bool:
    """Whether an answer carries stored gzip bytes (``Content-Encoding: gzip``)."""
    return "gzip" in headers.get("Content-Encoding", "").lower()


class GzipDecoder:
    """Incremental gzip decoding of a stream, members one after another.

    A gzip file may hold several members back to back (``cat a.gz b.gz``);
    like ``gzip.decompress`` (and GCS's transcoding), they decode to the
    concatenation of their contents.
    """

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._member = zlib.decompressobj(_GZIP_WBITS)
        self._started = False

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """The decoded bytes that ``data`` completes."""
        out: list[bytes] = []
        while data:
            self._started = True
            try:
                out.append(self._member.decompress(data))
            except zlib.error as exc:
                raise self._error(str(exc)) from exc
            if not self._member.eof:
                break
            data = self._member.unused_data
            self._member = zlib.decompressobj(_GZIP_WBITS)
            self._started = False
        return b"".join(out)

    def finish(self) -> bytes:
        """The last decoded bytes.

        Raises:
            StorageError: The stored bytes end inside a gzip member.
        """
        if self._started:
            tail = self._member.flush()
            if not self._member.eof:
                raise self._error("the gzip data ends mid-stream")
            return tail
        return b""

    def _error(self, why: str) -> StorageError:
        # Raised on bytes whose CRC32C is checked (or about to be, for a stream):
        # the object itself is not gzip, and reading it again will not help.
        return StorageError(
            f"the object has Content-Encoding: gzip but its stored bytes do not decode ({why}); "
            "fix its metadata or its contents",
            operation="get",
            uri=self._uri,
        )


def gunzip(data: bytes | bytearray | memoryview, uri: str) -> bytes:
    """The decoded bytes of a whole stored gzip object."""
    decoder = GzipDecoder(uri)
    head = decoder.feed(data)
    tail = decoder.finish()
    return head + tail if tail else head


async def read_decoded(transport: GCSTransport, url: yarl.URL, uri: str) -> bytes:
    """GET the whole stored gzip object ``url`` (no ``Range``), verify it, decode it.

    One request, no retries of its own: it runs inside a read's attempt.
    """
    _, headers, body = await transport.request("GET", url, operation="get", uri=uri)
    return decode_answer(headers, body, uri)


def decode_answer(headers: Mapping[str, str], body: bytes, uri: str) -> bytes:
    """The decoded bytes of a whole-object answer, its stored CRC32C checked."""
    if not served_gzip(headers):
        # Decoded by the server (transcoded): GCS gives no hash of these bytes.
        return body
    verify_crc32c(headers, crc_b64(extend_crc(0, body)), uri)
    return gunzip(body, uri)


async def stream_decoded(
    transport: GCSTransport,
    url_for: Callable[[int | None], yarl.URL],
    key: str,
    start: int,
    end: int | None,
    chunk_size: int,
    generation: int | None,
) -> AsyncIterator[bytes]:
    """Yield ``[start, end)`` of the decoded object, streaming its stored gzip bytes.

    A broken read resumes at the stored offset it reached (a ``Range`` of the
    stored bytes), pinned to the generation of the first answer; the stored
    bytes' CRC32C is checked once all of them have arrived.
    """
    uri = transport.urls.uri(key)

    def stored_bytes(headers: Mapping[str, str]) -> None:
        if not served_gzip(headers):
            raise IntegrityError(
                "the server stopped serving the object's stored gzip bytes",
                operation="stream",
                uri=uri,
            )

    # The stored bytes, all of them: offsets into the decoded ones are not theirs.
    reader = ResumingStream(
        transport, url_for, uri, 0, None, generation=generation, check=stored_bytes
    )

    async def checked() -> AsyncGenerator[bytes | bytearray | memoryview, None]:
        crc = 0
        async with contextlib.aclosing(reader.chunks(chunk_size)) as chunks:
            async for chunk in chunks:
                crc = extend_crc(crc, chunk)
                yield chunk
        # All of them arrived (a part only cannot be checked): before the last decoded bytes.
        if reader.hash_headers is not None:
            verify_crc32c(reader.hash_headers, crc_b64(crc), uri)

    async for piece in decode_range(uri, checked(), start, end):
        yield piece


async def decode_range(
    uri: str,
    stored: AsyncGenerator[bytes | bytearray | memoryview, None],
    start: int,
    end: int | None,
) -> AsyncIterator[bytes]:
    """Yield ``[start, end)`` of the decoded bytes of ``stored``, a gzip object's bytes from offset 0.

    ``stored`` is asked for no more once ``end`` is reached; its own checks
    run once it is exhausted, before the last decoded bytes are yielded.
    """
    decoder = GzipDecoder(uri)
    out = 0  # decoded bytes produced
    async with contextlib.aclosing(stored) as chunks:
        async for chunk in chunks:
            piece = decoder.feed(chunk)
            lo, hi = max(start - out, 0), len(piece)
            if end is not None:
                hi = min(hi, end - out)
            out += len(piece)
            if hi > lo:
                yield piece[lo:hi] if (lo, hi) != (0, len(piece)) else piece
            if end is not None and out >= end:
                return
    tail = decoder.finish()
    lo, hi = max(start - out, 0), len(tail)
    if end is not None:
        hi = min(hi, end - out)
    if hi > lo:
        yield tail[lo:hi]
