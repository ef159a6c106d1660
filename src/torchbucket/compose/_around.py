"""Reading around a straggling compose path, and ending one left running.

A group whose compose path (compose, read the composite, cut it) takes much
longer than recent ones, its compose still unanswered, is read directly as
well; the first to finish wins (:func:`read_around`). The compose path is
never cancelled in flight (a compose cancelled in flight may still create
its composite): it runs to its end and deletes its composite, unless an
epoch's drain can end it sooner (:func:`_settle_early`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from torchbucket.compose._anchor import Anchor
from torchbucket.compose.registry import delete_composite, drain_also, unregister
from torchbucket.errors import NotFoundError, StorageError
from torchbucket.runtime import accounting
from torchbucket.runtime.tasks import cancel_and_wait
from torchbucket.storage.base import ObjectInfo, ObjectStore
from torchbucket.storage.listed import read_verified

__all__ = ["DeleteFailed", "read_all", "read_around", "straggles"]

logger = logging.getLogger(__name__)

# Told of a composite's delete that failed (the compose health's bookkeeping).
DeleteFailed = Callable[[ObjectStore, str, StorageError], None]


async def read_all(store: ObjectStore, infos: Sequence[ObjectInfo]) -> list[bytes | BaseException]:
    """Each object read directly, pinned to its listed generation and size (or its error)."""
    return await asyncio.gather(*(read_verified(store, i) for i in infos), return_exceptions=True)


async def straggles(
    attempt: asyncio.Future[Any],
    after: float,
    needed: asyncio.Event | None,
    sooner: float | None,
) -> bool:
    """Whether ``attempt`` is still running ``after`` seconds from now.

    Or ``sooner`` seconds from now, if ``needed`` is set before then: the
    group holds its consumer, and waiting out its compose path no longer
    overlaps any other work.
    """
    if needed is None or sooner is None or sooner >= after:
        done, _ = await asyncio.wait({attempt}, timeout=after)
        return not done
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiter = asyncio.ensure_future(needed.wait())
    try:
        done, _ = await asyncio.wait(
            {attempt, waiter}, timeout=after, return_when=asyncio.FIRST_COMPLETED
        )
        if attempt in done:
            return False
        if waiter in done:
            left = started + sooner - loop.time()
            if left > 0:
                done, _ = await asyncio.wait({attempt}, timeout=left)
        return not attempt.done()
    finally:
        waiter.cancel()


async def read_around(
    store: ObjectStore,
    infos: Sequence[ObjectInfo],
    attempt: asyncio.Future[list[Any] | None],
    name: str,
    sent: dict[str, int],
    anchor: Anchor | None,
    *,
    delete_failed: DeleteFailed,
) -> list[Any]:
    """Read a group directly while its slow compose path goes on; the first to finish wins.

    The compose path is not cancelled here (a compose cancelled in flight may
    still create its composite): it runs to its end and deletes its composite
    as usual, its bytes unused if the direct reads won; an epoch's drain may
    end it sooner (:func:`_settle_early`).
    """
    logger.debug(
        "compose path of %d objects on %s straggling: reading them directly too",
        len(infos),
        store.uri(),
    )
    accounting.read_around(len(infos))
    direct = asyncio.ensure_future(read_all(store, infos))
    try:
        racing: set[asyncio.Future[Any]] = {attempt, direct}
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        attempt.cancel()
        direct.cancel()
        raise
    won = attempt.done() and not attempt.cancelled() and attempt.exception() is None
    if won and attempt.result() is not None:
        await cancel_and_wait([direct])
        data = attempt.result()
        assert data is not None
        return data
    if not attempt.done():
        attempt.add_done_callback(_finished)
        # Kept referenced until done, and an epoch's drain waits for it: it may
        # yet make a composite, and its own clean-up deletes it (a compose
        # retried past a 1 s deadline left one after the epoch had drained;
        # the fault matrix caught it).
        drain_also(
            attempt,
            settle=functools.partial(
                _settle_early, store, name, sent, attempt, anchor, delete_failed
            ),
        )
    elif not attempt.cancelled():
        attempt.exception()  # retrieved: the direct read stands in for it
    return await direct


async def _settle_early(
    store: ObjectStore,
    name: str,
    sent: dict[str, int],
    attempt: asyncio.Future[Any],
    anchor: Anchor | None,
    delete_failed: DeleteFailed,
) -> None:
    """At an epoch's drain, stop waiting for a compose path left running, when that is safe.

    A compose path left running after its group was read around is waited
    for, because until its compose answers, the compose may still make the
    composite. Two cases end it sooner:

    - Its compose named the window's anchor: once the anchor is deleted, no
      try of that compose can be applied any more, and one applied before is
      visible (see ``compose/_anchor.py``). The path is cancelled, and the
      composite, if found, deleted by generation.
    - Else, if the compose was sent exactly once and its composite exists,
      that one request has taken effect and nothing else can make the
      composite again once the path is cancelled (no retry is sent after
      that): the composite is then deleted, pinned to its generation,
      without waiting for the answer. The counts are read again after the
      HEAD, and the path is cancelled in the same step, so no retry can
      start in between.

    Otherwise (a compose sent more than once without an anchor, or whose
    composite does not exist yet) it is waited for as before.
    """
    if attempt.done():
        return
    if anchor is not None and sent.get("anchored") and await anchor.revoke():
        await _settle_revoked(store, name, sent, attempt, delete_failed)
        return
    if attempt.done() or sent.get("compose", 0) != 1:
        return
    try:
        composite = await store.head(name)
    except StorageError:
        # Not made yet, or unknown: it may still be. GCS promises a written
        # object readable only once its write has answered
        # (https://cloud.google.com/storage/docs/consistency), so a 404 here
        # proves nothing and is waited out; only a composite found is acted on,
        # and this compose is the only request that makes that name.
        return
    if attempt.done() or sent.get("compose", 0) != 1:
        return
    logger.debug(
        "composite %s exists while its compose is unanswered: deleting it now", store.uri(name)
    )
    await _end_path(store, name, sent, attempt, composite, delete_failed)


async def _settle_revoked(
    store: ObjectStore,
    name: str,
    sent: dict[str, int],
    attempt: asyncio.Future[Any],
    delete_failed: DeleteFailed,
) -> None:
    """End a compose path whose compose can no longer be applied (its anchor is gone)."""
    if attempt.done():
        return
    try:
        composite = await store.head(name)
    except NotFoundError:
        composite = None
    except StorageError:
        return  # unknown: waited for as before
    if attempt.done():
        return
    logger.debug(
        "compose of %s revoked by its anchor's delete: not waiting for its answer",
        store.uri(name),
    )
    await _end_path(store, name, sent, attempt, composite, delete_failed)


async def _end_path(
    store: ObjectStore,
    name: str,
    sent: dict[str, int],
    attempt: asyncio.Future[Any],
    composite: ObjectInfo | None,
    delete_failed: DeleteFailed,
) -> None:
    """Cancel a compose path left running; delete its composite here, or forget the name.

    The path's own clean-up stands down (``sent["settled"]``): it would send
    a delete unpinned to any generation, hence never re-sent, which a stall
    could hold on the drain's path for a composite known to be gone or
    deleted here.
    """
    sent["settled"] = 1
    attempt.cancel()
    if composite is None:
        unregister(store, name)
        return
    error = await delete_composite(store, name, composite.generation)
    if error is not None:
        delete_failed(store, name, error)


def _finished(attempt: asyncio.Future[list[Any] | None]) -> None:
    if not attempt.cancelled() and attempt.exception() is not None:
        logger.debug("compose path read around failed: %s", attempt.exception())
