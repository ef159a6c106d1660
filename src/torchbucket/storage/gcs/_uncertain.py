"""Writes whose outcome is uncertain: retried safely, recognised by the object itself.

A write that failed without a definite answer (a server error, a reset, a
timeout, a garbled answer) may have taken effect. :func:`write` retries such a
write without ever repeating it blindly, and :func:`written_anyway` recognises
it by the object, which holds exactly what was sent (size and CRC32C) if it did.
The simple upload, the last chunk of a resumable upload and a compose with a
precondition go through here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from torchbucket.errors import (
    DeadlineExceededError,
    IntegrityError,
    PreconditionFailedError,
    RetryableError,
    StorageError,
    ThrottledError,
)
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import _head
from torchbucket.storage.gcs._transport import GCSTransport

__all__ = ["check_written", "holds", "uncertain", "write", "written_anyway"]

logger = logging.getLogger(__name__)


def uncertain(exc: BaseException) -> bool:
    """Whether a write that failed with ``exc`` may nevertheless have taken effect.

    Everything that is not a definite answer: a server error, a reset, a
    timeout (a cancelled attempt), a garbled answer, retries that ran out. A 429
    is a definite refusal: the service did not act on the request.
    """
    if isinstance(exc, ThrottledError) and exc.status == 429:
        return False
    return isinstance(exc, (RetryableError, DeadlineExceededError, asyncio.CancelledError))


def holds(info: ObjectInfo | None, size: int, crc32c: str | None) -> bool:
    """Whether the object ``info`` describes holds exactly ``size`` bytes with ``crc32c``.

    Without a CRC32C to compare (``crc32c`` or the object's is ``None``) the size
    alone decides.
    """
    if info is None or info.size != size:
        return False
    return crc32c is None or info.crc32c is None or info.crc32c == crc32c


async def write(
    transport: GCSTransport,
    send: Callable[[int | None], Awaitable[ObjectInfo]],
    key: str,
    *,
    size: int,
    crc32c: str | None,
    if_generation_match: int | None,
    operation: str,
) -> ObjectInfo:
    """Run a write with retries that never repeat it blindly.

    ``send(precondition)`` makes one attempt, with ``ifGenerationMatch`` set
    to ``precondition`` (``None``: no precondition). The first attempt uses
    ``if_generation_match``. After an attempt whose outcome is uncertain
    (see :func:`uncertain`):

    - without a precondition, the object is read before the next attempt
      (one HEAD): if it holds what was sent (``size`` and ``crc32c``), that
      was this write and it is returned; otherwise the next attempts are
      pinned to the generation just seen (0 for no object), so a repeat
      cannot overwrite a write made meanwhile by someone else;
    - with one, the repeat meets a 412 if the lost attempt took effect, and
      a 412 after an uncertain attempt is checked the same way;
    - when retries give up after an uncertain attempt, the object is
      checked once more (:func:`written_anyway`).

    So an unconditional write costs one request when nothing fails, and is
    retried like any idempotent request when something does.

    Raises:
        PreconditionFailedError: ``if_generation_match`` (or the generation
            seen before a retry) did not hold, and the object is not this
            write's.
        StorageError: The write failed and the object does not hold what
            was sent.
    """
    uri = transport.urls.uri(key)
    precondition = if_generation_match
    unsure = False

    async def attempt() -> ObjectInfo:
        nonlocal precondition, unsure
        if unsure and precondition is None:
            info = await _head.head_once(transport, key, operation)
            if info is not None and holds(info, size, crc32c):
                logger.debug("%s %s: an earlier attempt took effect", operation, uri)
                return info
            precondition = 0 if info is None else info.generation
        try:
            return await send(precondition)
        except PreconditionFailedError:
            if unsure:
                info = await _head.head_once(transport, key, operation)
                if info is not None and holds(info, size, crc32c):
                    logger.debug("%s %s: an earlier attempt took effect", operation, uri)
                    return info
            raise
        except (StorageError, asyncio.CancelledError) as exc:
            unsure = unsure or uncertain(exc)
            raise

    try:
        return await transport.call(attempt, operation, uri)
    except (PreconditionFailedError, IntegrityError):
        raise
    except StorageError as exc:
        if not unsure:
            raise
        return await written_anyway(transport, exc, key, size=size, crc32c=crc32c)


async def written_anyway(
    transport: GCSTransport, error: StorageError, key: str, *, size: int, crc32c: str | None
) -> ObjectInfo:
    """The object, if a write that failed with ``error`` took effect after all.

    For a write whose outcome is uncertain (its answers were lost until the
    retry deadline, say): if the object now holds exactly what was sent,
    ``size`` bytes with ``crc32c``, the write is accepted.

    Raises:
        StorageError: ``error`` itself, when the object does not hold what
            was sent or cannot be read.
    """
    uri = transport.urls.uri(key)
    if not uncertain(error):
        raise error
    try:
        info = await _head.head_or_none(transport, key)
    except StorageError:
        logger.debug("%s: could not check the object after a failed write", uri, exc_info=True)
        info = None
    if info is None or not holds(info, size, crc32c):
        raise error
    logger.info(
        "%s %s failed (%s), but the object holds what was sent: accepted",
        error.operation,
        uri,
        type(error).__name__,
    )
    return info


def check_written(
    info: ObjectInfo, size: int, crc32c: str | None, operation: str, uri: str
) -> ObjectInfo:
    """Raise ``IntegrityError`` if the server stored other bytes than we sent."""
    if info.size != size or (crc32c and info.crc32c and info.crc32c != crc32c):
        raise IntegrityError(
            f"stored {info.size} bytes with CRC32C {info.crc32c}, sent {size} with {crc32c}",
            operation=operation,
            uri=uri,
        )
    return info
