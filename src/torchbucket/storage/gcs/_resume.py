"""A streamed GET that resumes where it broke: the one loop of every GCS stream.

A stream of an object's stored bytes ``[start, end)`` may take several GETs: a
read cut short (a reset, a timeout, a body that ends early) is asked again
from the byte it reached, pinned to the generation of the first answer, so the
bytes never mix two versions of the object. :func:`._reads.stream` (plain
objects) and :func:`._gzip.stream_decoded` (gzip-encoded ones, decoded as they
arrive) both read through :class:`ResumingStream`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator, Callable, Mapping

import aiohttp
import yarl

from torchbucket.errors import IntegrityError
from torchbucket.runtime import accounting
from torchbucket.storage.gcs._transport import TRANSPORT_ERRORS, GCSTransport
from torchbucket.storage.gcs._wire import (
    content_range,
    hash_header_crc32c,
    range_header,
    stream_end,
)

__all__ = ["MAX_RESUMES", "ResumingStream"]

logger = logging.getLogger(__name__)

#: Reads of one stream after the first, at most.
MAX_RESUMES = 10


class ResumingStream:
    """The stored bytes ``[start, end)`` of one object, over as many GETs as it takes.

    Args:
        transport: The store's transport.
        url_for: The object's media URL, pinned to a generation (or ``None``).
        uri: The object, for messages.
        start: First byte.
        end: One past the last byte, or ``None`` for the end of the object.
        generation: Read this generation; default the first answer's.
        allow: Statuses that end the stream with no bytes (416 past the end).
        check: Called on each answer's headers before its body is read; raises
            to refuse it (the gzip stream: an answer not of the stored bytes).

    Attributes:
        pos: The next byte to receive.
        generation: The generation read (once the first answer named it).
        hash_headers: The last answer's headers that carry the object's
            ``x-goog-hash``, to check the whole object's CRC32C against.
    """

    def __init__(
        self,
        transport: GCSTransport,
        url_for: Callable[[int | None], yarl.URL],
        uri: str,
        start: int,
        end: int | None,
        *,
        generation: int | None = None,
        allow: tuple[int, ...] = (),
        check: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        self._transport = transport
        self._url_for = url_for
        self._uri = uri
        self._end = end
        self._allow = allow
        self._check = check
        self._total: int | None = None
        self.pos = start
        self.generation = generation
        self.hash_headers: Mapping[str, str] | None = None

    async def open(self) -> aiohttp.ClientResponse:
        """The next GET, from :attr:`pos`, with the transport's retries."""
        transport = self._transport
        opener = functools.partial(
            transport.open_stream,
            self._url_for(self.generation),
            range_header(self.pos, self._end),
            self._uri,
            allow=self._allow,
        )
        return await transport.call(opener, "stream", self._uri)

    async def chunks(
        self, chunk_size: int, first: aiohttp.ClientResponse | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Yield the bytes as they arrive, opening (from ``first``, if given) and resuming.

        Use under :func:`contextlib.aclosing` where the caller may stop early,
        so the answer being read is released at once.

        Raises:
            IntegrityError: An answer from another byte than asked for, or a
                stream that ended early more than :data:`MAX_RESUMES` times.
            StorageError: The read broke more than :data:`MAX_RESUMES` times.
        """
        resp = first
        resumes = 0
        while True:
            if resp is None:
                resp = await self.open()
            broken: BaseException | None = None
            try:
                if resp.status in self._allow:
                    return
                skip = self._accept(resp)
                try:
                    async for chunk in resp.content.iter_chunked(chunk_size):
                        if skip:
                            cut = min(skip, len(chunk))
                            chunk, skip = chunk[cut:], skip - cut
                        if self._end is not None and self.pos + len(chunk) > self._end:
                            chunk = chunk[: self._end - self.pos]
                        if not chunk:
                            continue
                        self.pos += len(chunk)
                        accounting.received(len(chunk))
                        yield chunk
                        if self._end is not None and self.pos >= self._end:
                            break
                except TRANSPORT_ERRORS as exc:
                    broken = exc
            finally:
                resp.release()
            resp = None
            stop = stream_end(self._end, self._total)
            if broken is None and (stop is None or self.pos >= stop):
                return
            resumes += 1
            if resumes > MAX_RESUMES:
                if broken is not None:
                    raise self._transport.transport_error(broken, "stream", self._uri) from broken
                raise IntegrityError(
                    f"stream ended at byte {self.pos}, expected {stop}",
                    operation="stream",
                    uri=self._uri,
                )
            logger.debug("stream of %s broke at byte %d; resuming", self._uri, self.pos)

    def _accept(self, resp: aiohttp.ClientResponse) -> int:
        """Check an answer and note what it says; the bytes to skip at its start."""
        if self._check is not None:
            self._check(resp.headers)
        if self.generation is None and resp.headers.get("x-goog-generation"):
            self.generation = int(resp.headers["x-goog-generation"])
        span = content_range(resp.headers)
        if span is not None and span[2] is not None:
            self._total = span[2]
        elif resp.status == 200 and resp.content_length is not None:
            self._total = resp.content_length
        if hash_header_crc32c(resp.headers) is not None:
            self.hash_headers = resp.headers
        if resp.status == 206 and span is not None and span[0] != self.pos:
            raise IntegrityError(
                f"asked for bytes from {self.pos}, got them from {span[0]}",
                operation="stream",
                uri=self._uri,
            )
        return self.pos if resp.status == 200 else 0  # the server ignored Range
