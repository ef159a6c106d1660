"""Reading a group of objects: composed server-side when that pays, else directly.

Correctness never depends on compose. Every source is pinned to its listed
generation and the composite's length is checked against the listed sizes; on
any failure of the compose path the group is read directly, where each object is
again pinned to its listed generation and checked against its listed size, so an
object rewritten or deleted since it was listed raises ``NotFoundError`` (never
new bytes under an old listing).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from torchbucket.compose._anchor import Anchor
from torchbucket.compose._around import read_all, read_around, straggles
from torchbucket.compose._composite import ReceiveInto, read_and_cut
from torchbucket.compose._recent import RecentTimes
from torchbucket.compose._softdelete import soft_delete_allows, soft_delete_blocked
from torchbucket.compose._tuning import TUNING
from torchbucket.compose.config import ComposeConfig
from torchbucket.compose.registry import (
    delete_in_background,
    register,
    unregister,
)
from torchbucket.errors import (
    DeadlineExceededError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    StorageError,
    ThrottledError,
)
from torchbucket.runtime import accounting
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["compose_allowed", "fetch_group"]

logger = logging.getLogger(__name__)

# Process-wide compose health per bucket URI: refused for good (403), or
# throttled until a monotonic time. One WARNING per reason per process.
_refused: set[str] = set()
_cooldown_until: dict[str, float] = {}
_warned: set[str] = set()


def _warn_once(reason: str, message: str, *args: object) -> None:
    if reason in _warned:
        logger.debug(message, *args)
        return
    _warned.add(reason)
    logger.warning(message, *args)


def compose_allowed(store: ObjectStore, config: ComposeConfig) -> bool:
    """Whether groups on ``store`` should be composed now."""
    if not config.enabled or store.bucket == "/":
        # The local filesystem: reads cost no round trip, and composites would
        # land at the filesystem root.
        return False
    key = store.uri()
    if key in _refused or soft_delete_blocked(store, config):
        return False
    until = _cooldown_until.get(key)
    if until is not None:
        if time.monotonic() < until:
            return False
        del _cooldown_until[key]
    return True


async def _compose_and_read(
    store: ObjectStore,
    name: str,
    infos: Sequence[ObjectInfo],
    config: ComposeConfig,
    receive_into: ReceiveInto | None,
    sent: dict[str, int],
    anchor: Anchor | None,
) -> tuple[list[Any] | None, bool, int | None]:
    """Compose, read the composite and split it.

    The compose's requests (each try of its retries) are counted in ``sent``;
    ``sent["anchored"]`` is 1 when the compose named ``anchor`` as its first
    source, ``sent["answered"]`` once the composite is known to exist.

    Returns:
        The group's objects' bytes, or ``None`` to read the group directly;
        whether the composite may exist (and so must be deleted); and its
        generation when known, which makes its delete safe to retry.
    """
    key = store.uri()
    sources = infos
    first = await anchor.info() if anchor is not None else None
    if first is not None:
        sources = [first, *infos]
        sent["anchored"] = 1
    try:
        with accounting.tally_requests(sent):
            composite = await store.compose(name, sources, if_generation_match=0)
    except PermissionDeniedError as exc:
        _refused.add(key)
        _warn_once(
            "refused",
            "compose refused on %s (%s): reading objects one by one from now on in this "
            "process; grant storage.objects.create and .delete, or set "
            "ComposeConfig(enabled=False) to silence this",
            key,
            exc,
        )
        return None, False, None
    except (ThrottledError, DeadlineExceededError) as exc:
        _cooldown_until[key] = time.monotonic() + config.throttle_cooldown
        _warn_once(
            "throttled",
            "compose throttled on %s (%s): reading objects directly for %g s at a time",
            key,
            exc,
            config.throttle_cooldown,
        )
        return None, True, None
    except PreconditionFailedError:
        # Either a source was rewritten (the generation pin), or an earlier
        # attempt of this very compose succeeded and its answer was lost (the
        # destination's ifGenerationMatch=0). The name is ours alone: if it
        # exists, it is this group's composite.
        try:
            composite = await store.head(name)
        except NotFoundError:
            return None, False, None
    except NotFoundError:
        # A source is gone (the direct read names it), or the anchor was
        # revoked: this compose can never be applied.
        return None, False, None
    except StorageError as exc:
        logger.debug("compose %s failed (%s); reading its sources directly", store.uri(name), exc)
        return None, True, None
    # Answered: what is left is the composite's read, which is hedged like any
    # read (GCSConfig.hedge), so the group is no longer read around.
    sent["answered"] = 1
    expected = sum(i.size for i in infos)
    if composite.size != expected:
        logger.debug(
            "composite %s is %d bytes, its sources were listed with %d",
            store.uri(name),
            composite.size,
            expected,
        )
        return None, True, composite.generation
    return await read_and_cut(store, composite, infos, receive_into), True, composite.generation


def _delete_failed(store: ObjectStore, name: str, error: StorageError) -> None:
    if isinstance(error, PermissionDeniedError):
        _refused.add(store.uri())
        _warn_once(
            "delete refused",
            "deleting composite %s was refused (%s): compose is off for %s in this "
            "process; run `torchbucket cleanup` with an account that may delete",
            store.uri(name),
            error,
            store.uri(),
        )


# Recent compose-path durations (compose + composite read) per bucket, for
# TUNING.read_around_after (compose/_tuning.py).
_recent = RecentTimes()


def _read_around_after(store: ObjectStore) -> float | None:
    """Seconds after which a group's compose path is read around, or ``None``."""
    if TUNING.read_around_after <= 0:
        return None
    return _recent.straggling_after(store.uri(), TUNING.read_around_after, TUNING.read_around_floor)


# Before any compose path on a bucket has finished in this process, a window's
# first groups (started together) share what slows them: a worker's start, a
# loaded client or server. Reading all of them around at once doubled that load
# when it was highest: on a 2-core AMD EPYC VM (benchmarks/sizes.py, 256 KiB,
# map-style defaults, an epoch's first contender) every one of a worker's
# first 16 groups was read around 0.7 s after the window began (512 of 6,000
# objects read twice, the consumer's first wait for a group 1.1-1.7 s, the
# epoch 1,100-1,500 samples/s against 2,100-2,500 when none was). While
# others run beside it, a group does not count as straggling until one of
# them has finished (the median to compare with), or this long has passed.
# A group alone has no peer to compare with: the unmeasured bound applies.
_FIRST_FINISH_MOST = 2.0
# How often a group waiting for the first to finish looks again.
_FIRST_FINISH_POLL = 0.05
# Compose paths running per bucket URI (in this process's loop).
_running: collections.Counter[str] = collections.Counter()
os.register_at_fork(after_in_child=_running.clear)  # the parent's paths are not the child's


def _run_counted(key: str, attempt: asyncio.Future[Any]) -> None:
    _running[key] += 1

    def done(_: asyncio.Future[Any]) -> None:
        _running[key] -= 1
        if _running[key] <= 0:
            del _running[key]

    attempt.add_done_callback(done)


def _read_around_needed_after(store: ObjectStore) -> float | None:
    """The same bound for a group its consumer is already waiting for, or ``None``."""
    if TUNING.read_around_needed_after <= 0:
        return None
    return _recent.straggling_after(
        store.uri(), TUNING.read_around_needed_after, TUNING.read_around_needed_floor
    )


async def _composed(
    store: ObjectStore,
    name: str,
    infos: Sequence[ObjectInfo],
    config: ComposeConfig,
    receive_into: ReceiveInto | None,
    sent: dict[str, int],
    anchor: Anchor | None,
) -> list[Any] | None:
    """Compose, read and split the group, then delete the composite (in the background).

    Returns:
        The group's objects' bytes, or ``None`` to read the group directly.
    """
    t0 = time.monotonic()
    may_exist = True
    generation: int | None = None
    data: list[Any] | None = None
    try:
        data, may_exist, generation = await _compose_and_read(
            store, name, infos, config, receive_into, sent, anchor
        )
    finally:
        if sent.get("settled"):
            pass  # a drain ended this path, and deletes (or forgets) the composite itself
        elif may_exist:
            # Off the critical path: the group's bytes are returned now.
            delete_in_background(
                store,
                name,
                generation,
                on_error=functools.partial(_delete_failed, store, name),
                resend_after=TUNING.read_around_after,
                resend_floor=TUNING.read_around_floor,
            )
        else:
            unregister(store, name)
    if data is not None:
        _recent.add(store.uri(), time.monotonic() - t0)
    return data


async def _straggling(
    store: ObjectStore, attempt: asyncio.Future[Any], needed: asyncio.Event | None
) -> bool:
    """Whether the compose path ``attempt`` straggles: still running past its bound.

    The bound (``read_around_after``, or ``read_around_needed_after`` once
    ``needed`` is set) counts from now. While nothing is measured on the
    bucket and other compose paths run beside this one, it does not count as
    straggling, for :data:`_FIRST_FINISH_MOST` at most; then the bound holds.
    """
    key = store.uri()
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not _recent.measured(key) and loop.time() - started < _FIRST_FINISH_MOST:
        if _running[key] <= 1:
            bound = _read_around_after(store) or math.inf
            if needed is not None and needed.is_set():
                bound = min(bound, _read_around_needed_after(store) or math.inf)
            if loop.time() - started >= bound:
                return True  # alone: the unmeasured bound holds
        await asyncio.wait({attempt}, timeout=_FIRST_FINISH_POLL)
        if attempt.done():
            return False
    waited = loop.time() - started
    after = _read_around_after(store)
    if after is None:  # turned off meanwhile
        return False
    sooner = _read_around_needed_after(store) if needed is not None else None
    return await straggles(
        attempt,
        max(0.0, after - waited),
        needed,
        None if sooner is None else max(0.0, sooner - waited),
    )


async def fetch_group(
    store: ObjectStore,
    infos: Sequence[ObjectInfo],
    config: ComposeConfig,
    *,
    receive_into: ReceiveInto | None = None,
    needed: asyncio.Event | None = None,
    anchor: Anchor | None = None,
) -> list[Any]:
    """Read a group of objects, through one composite when compose is allowed.

    The composite, if one was made, is deleted in the background, off the
    group's critical path (:func:`~torchbucket.compose.registry.drain_deletes` waits
    for those deletes); if a delete fails, the composite stays registered for
    deletion at process exit.

    Args:
        store: The store holding every object of the group.
        infos: The objects as listed (name, size, generation).
        config: Compose settings.
        receive_into: Makes the ``Destination`` (``compose/_composite.py``)
            a composite is received into, given its size; its pieces are
            returned for a composed group. Default: a pooled buffer, cut into
            ``bytes`` copies.
        needed: Set when the group's consumer is waiting for it: its compose
            path is then read around after ``read_around_needed_after``
            times the recent median, not ``read_around_after`` (both in
            :mod:`._tuning`).
        anchor: The caller's :class:`~torchbucket.compose._anchor.Anchor` on
            ``store``, named as the compose's first source (``infos`` then
            holds at most ``max_sources - 1`` objects): a drain can then
            revoke a compose path left running instead of waiting for it.

    Returns:
        Each object's bytes (or, for a group read through a composite with
        ``receive_into``, its piece of the destination), or the error that
        reading it raised, in order.
    """
    if (
        len(infos) < 2
        or not compose_allowed(store, config)
        # A composite holds a gzip object's stored bytes, not what a read of it
        # returns (https://cloud.google.com/storage/docs/transcoding).
        or any(info.transcoded for info in infos)
        or not await soft_delete_allows(store, config)
    ):
        return await read_all(store, infos)
    name = f"{config.composite_prefix}{uuid.uuid4().hex}"
    register(store, name)
    sent: dict[str, int] = {}
    attempt = asyncio.ensure_future(
        _composed(store, name, infos, config, receive_into, sent, anchor)
    )
    _run_counted(store.uri(), attempt)
    if _read_around_after(store) is not None:
        try:
            straggling = await _straggling(store, attempt, needed)
        except asyncio.CancelledError:
            attempt.cancel()  # its own clean-up deletes what it may have made
            raise
        # Only a compose is read around (a write, never sent twice). Once it
        # has answered, reading the group object by object as well only races
        # the composite's read, which is hedged like any read (docs/reliability.md).
        if straggling and not sent.get("answered"):
            return await read_around(
                store, infos, attempt, name, sent, anchor, delete_failed=_delete_failed
            )
    data = await attempt
    if data is None:
        return await read_all(store, infos)
    return data
