"""A group whose compose straggles is read object by object meanwhile (issue 19).

Over HTTP against the emulator: the group's first compose is held by the
server (a ``stall`` fault, then the connection reset, which the client retries).
A composite's delete held the same way is sent again.
With ``read_around_after`` on (a knob of ``torchbucket.compose._tuning``,
which these tests patch), the group's objects are read directly while the
compose path goes on; the compose path still ends by deleting its composite.
With it off, the group waits for the compose's retry. Request counts, not times,
tell the two apart. Through a dataset, whose window names an anchor in its
composes, a compose held before it is applied (a ``stall_apply`` fault) is
revoked at the window's end instead of waited for.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig, registry
from torchbucket.compose import _fetch as compose_fetch
from torchbucket.compose._tuning import ENV, TUNING
from torchbucket.compose.registry import drain_deletes
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketIterableDataset
from torchbucket.emulator import Emulator
from torchbucket.runtime import accounting
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator

N = 8
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=30.0, attempt_timeout=20.0, read_timeout=10.0
)


@pytest.fixture(autouse=True)
def tune(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Set compose tuning for one test; each starts with ``read_around_floor`` 0.2 s."""

    def set_(**values: Any) -> None:
        for name, value in values.items():
            monkeypatch.setattr(TUNING, name, value)

    set_(read_around_floor=0.2)
    return set_


def payload(i: int) -> bytes:
    return f"object-{i:03d};".encode() * (3 + i)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"around-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"g/{i:03d}": payload(i) for i in range(N)})
    return name


def _group(
    emulator: Emulator, bucket: str, config: ComposeConfig, retry: RetryConfig = RETRY
) -> tuple[list[object], GCSStore]:
    gcs = GCSConfig(
        endpoint=emulator.endpoint,
        anonymous=True,
        retry=retry,
        hedge=HedgeConfig(enabled=False),  # only the reads this test asks for
    )
    store = GCSStore(bucket, config=gcs)
    infos = runtime.run(store.list_page("g/")).objects
    assert len(infos) == N
    got = runtime.run(compose_fetch.fetch_group(store, infos, config))
    return list(got), store


def _held(
    emulator: Emulator, bucket: str, kind: str, seconds: float, config: ComposeConfig
) -> tuple[GCSStore, dict[str, int]]:
    """The group read with its first compose held by a ``kind`` fault; the counts before."""
    emulator.add_fault("compose", kind, count=1, stall_seconds=seconds)
    before = emulator.stats()["by_op"]
    got, store = _group(emulator, bucket, config)
    assert got == [payload(i) for i in range(N)]
    return store, before


def _settle(emulator: Emulator, bucket: str, store: GCSStore) -> list[str]:
    """Wait for compose paths left running and their deletes; the composites left."""
    runtime.run(drain_deletes(), timeout=60)
    assert not registry._pending
    runtime.run(store.close())
    return emulator.object_names(bucket, COMPOSITE_PREFIX)


def test_a_stalled_compose_is_read_around_and_its_composite_still_deleted(
    emulator: Emulator, bucket: str
) -> None:
    store, before = _held(emulator, bucket, "stall", 3.0, ComposeConfig())
    left = _settle(emulator, bucket, store)
    after = emulator.stats()["by_op"]
    # Each object was read directly while the compose was held ...
    gets = after.get("get", 0) - before.get("get", 0)
    assert gets >= N
    # ... and the compose path went on: retried, read and deleted its composite.
    assert after.get("compose", 0) - before.get("compose", 0) == 2
    assert left == []


@pytest.mark.parametrize("needed", [False, True])
def test_a_held_composite_read_is_not_read_around(
    emulator: Emulator, bucket: str, needed: bool, tune: Callable[..., None]
) -> None:
    # The compose answers at once; the composite's GET is held 1.5 s (then
    # its connection closed, and the read retried), far past both bounds.
    # Only a compose is read around: the group waits for its composite's
    # read (hedged like any read where hedging is on; off in this test, so
    # the count of GETs is exact), even when its consumer waits for it.
    tune(read_around_needed_floor=0.2)
    emulator.add_fault("get", "stall", count=1, stall_seconds=1.5, match=COMPOSITE_PREFIX)
    gcs = GCSConfig(
        endpoint=emulator.endpoint, anonymous=True, retry=RETRY, hedge=HedgeConfig(enabled=False)
    )
    store = GCSStore(bucket, config=gcs)
    infos = runtime.run(store.list_page("g/")).objects
    before = emulator.stats()["by_op"]

    async def fetch() -> list[object]:
        waited_for = asyncio.Event()
        if needed:
            waited_for.set()
        return list(
            await compose_fetch.fetch_group(store, infos, ComposeConfig(), needed=waited_for)
        )

    counted = accounting.snapshot()
    got = runtime.run(fetch())
    counted = accounting.snapshot() - counted
    assert got == [payload(i) for i in range(N)]
    after = emulator.stats()["by_op"]
    # The composite's GET, held, and its retry: no object read directly.
    assert after.get("get", 0) - before.get("get", 0) == 2
    assert counted.read_around == 0
    assert after.get("compose", 0) - before.get("compose", 0) == 1
    assert _settle(emulator, bucket, store) == []


def test_with_read_around_off_the_group_waits_for_its_compose(
    emulator: Emulator, bucket: str, tune: Callable[..., None]
) -> None:
    tune(read_around_after=0)
    store, before = _held(emulator, bucket, "stall", 1.5, ComposeConfig())
    left = _settle(emulator, bucket, store)
    after = emulator.stats()["by_op"]
    # One GET: the composite's, after the compose's retry.
    assert after.get("get", 0) - before.get("get", 0) == 1
    assert after.get("compose", 0) - before.get("compose", 0) == 2
    assert left == []


def test_a_drain_waits_for_a_compose_path_left_running(emulator: Emulator, bucket: str) -> None:
    # Every compose takes effect and loses its answer, so the compose path
    # retries until its deadline while the group is read around it; then it
    # deletes the composite it made. An epoch drains before it ends: the
    # drain must wait for that compose path and its delete (it returned at
    # once, and the composite was still in the bucket).
    emulator.add_fault("compose", "reset", count=None)
    retry = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=1.5, attempt_timeout=1.0)
    got, store = _group(emulator, bucket, ComposeConfig(), retry)
    assert got == [payload(i) for i in range(N)]
    assert registry._pending  # read around: the compose path goes on
    runtime.run(drain_deletes(), timeout=60)
    assert not registry._pending
    assert emulator.object_names(bucket, COMPOSITE_PREFIX) == []
    emulator.clear_faults()
    runtime.run(store.close())


def test_a_stalled_composite_delete_is_sent_again(emulator: Emulator, bucket: str) -> None:
    # A dataset's epoch ends by waiting for its composites' deletes: one
    # stalled delete held a sub-second epoch for seconds. The server holds the
    # first delete for 10 minutes and the client's read timeout is longer
    # still, so only a second delete can end the wait within the bound below.
    emulator.add_fault("delete", "stall", count=1, stall_seconds=600.0)
    before = emulator.stats()["by_op"]
    retry = RetryConfig(
        initial_backoff=0.01, deadline=1200.0, attempt_timeout=900.0, read_timeout=900.0
    )
    got, store = _group(emulator, bucket, ComposeConfig(), retry)
    assert got == [payload(i) for i in range(N)]
    runtime.run(drain_deletes(), timeout=60)
    after = emulator.stats()["by_op"]
    assert after.get("delete", 0) - before.get("delete", 0) == 2
    assert emulator.object_names(bucket, COMPOSITE_PREFIX) == []
    runtime.run(store.close())


def test_a_drain_deletes_a_made_composite_without_waiting_for_its_compose_answer(
    emulator: Emulator, bucket: str
) -> None:
    # The compose is applied and its answer held 8 s (under the client's 10 s
    # read timeout, so it is sent once). The group is read around; the
    # drain finds the composite there, ends the compose path and deletes it
    # by generation, instead of waiting 8 s for the answer, a retry and a GET.
    config = ComposeConfig()
    store, before = _held(emulator, bucket, "stall_answer", 8.0, config)
    assert registry._pending  # the compose path still waits for its answer
    runtime.run(drain_deletes(), timeout=60)
    after = emulator.stats()["by_op"]
    assert not registry._pending
    assert emulator.object_names(bucket, COMPOSITE_PREFIX) == []
    assert registry.in_flight() == []
    assert after.get("compose", 0) - before.get("compose", 0) == 1  # never retried
    assert after.get("get", 0) - before.get("get", 0) == N  # the composite never read
    assert after.get("head", 0) - before.get("head", 0) == 1
    # One delete, pinned to the composite's generation: the cancelled path's
    # own clean-up does not send another.
    assert after.get("delete", 0) - before.get("delete", 0) == 1
    runtime.run(store.close())


def test_a_drain_waits_for_a_compose_held_before_it_was_applied(
    emulator: Emulator, bucket: str
) -> None:
    # Held before the store applies it: no composite yet, so the drain has
    # nothing to delete and waits for the compose path (its retry, the GET
    # of the composite it then makes, and its delete).
    store, before = _held(emulator, bucket, "stall", 2.0, ComposeConfig())
    runtime.run(drain_deletes(), timeout=60)
    after = emulator.stats()["by_op"]
    assert emulator.object_names(bucket, COMPOSITE_PREFIX) == []
    assert after.get("head", 0) - before.get("head", 0) == 1  # looked, found nothing
    assert after.get("compose", 0) - before.get("compose", 0) == 2
    assert after.get("get", 0) - before.get("get", 0) == N + 1
    runtime.run(store.close())


# The usual bound far above the stall, the bound for a waited-for group below it.
SOONER_WHEN_NEEDED: dict[str, Any] = {
    "read_around_floor": 30.0,
    "read_around_needed_after": 2.0,
    "read_around_needed_floor": 0.2,
}


@pytest.mark.parametrize(("needed_at", "read_around"), [(0.0, True), (0.4, True), (None, False)])
def test_a_group_its_consumer_waits_for_is_read_around_sooner(
    emulator: Emulator,
    bucket: str,
    needed_at: float | None,
    read_around: bool,
    tune: Callable[..., None],
) -> None:
    # The compose is held 2 s, far under the usual bound (30 s): only a group
    # marked as waited for (at once, or 0.4 s in) is read around meanwhile.
    tune(**SOONER_WHEN_NEEDED)
    emulator.add_fault("compose", "stall", count=1, stall_seconds=2.0)
    gcs = GCSConfig(
        endpoint=emulator.endpoint,
        anonymous=True,
        retry=RETRY,
        hedge=HedgeConfig(enabled=False),
    )
    store = GCSStore(bucket, config=gcs)
    infos = runtime.run(store.list_page("g/")).objects
    before = emulator.stats()["by_op"]

    async def fetch() -> list[object]:
        needed = asyncio.Event()
        if needed_at is not None:
            asyncio.get_running_loop().call_later(needed_at, needed.set)
        return list(await compose_fetch.fetch_group(store, infos, ComposeConfig(), needed=needed))

    counted = accounting.snapshot()
    got = runtime.run(fetch())
    gets_when_returned = emulator.stats()["by_op"].get("get", 0) - before.get("get", 0)
    counted = accounting.snapshot() - counted
    assert got == [payload(i) for i in range(N)]
    if read_around:
        # Returned with the compose still held: the objects were read directly,
        # and counted as read around.
        assert gets_when_returned == N
        assert counted.read_around == N
    else:
        # Returned after the compose's retry, through its composite alone.
        assert gets_when_returned == 1
        assert counted.read_around == 0
    assert _settle(emulator, bucket, store) == []
    assert emulator.stats()["by_op"].get("compose", 0) - before.get("compose", 0) == 2


@pytest.mark.parametrize(
    ("hold", "seconds", "read_around", "gets"),
    [
        # All four composes take 1 s, past the bound that applies while nothing
        # is measured (0.5 s): none is slower than its peers, so none is read
        # around (each was, doubling the reads at an epoch's start). 4 GETs:
        # the composites alone.
        (4, 1.0, 0, 4),
        # One held 3 s: once its peers have finished, the bound follows their
        # median (at least read_around_floor, 0.2 s here), and the held group
        # is read around before its compose is answered: 3 composites and its
        # N objects when the call returns.
        (1, 3.0, N, 3 + N),
    ],
)
def test_groups_started_together_are_read_around_only_when_slower_than_their_peers(
    emulator: Emulator, hold: int, seconds: float, read_around: int, gets: int
) -> None:
    # A window's first groups start at once, with nothing measured on the
    # bucket yet: four groups of N, the first ``hold`` composes held
    # ``seconds`` before the store applies them, then answered as usual.
    name = f"together-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"g/{i:03d}": payload(i) for i in range(4 * N)})
    gcs = GCSConfig(
        endpoint=emulator.endpoint, anonymous=True, retry=RETRY, hedge=HedgeConfig(enabled=False)
    )
    store = GCSStore(name, config=gcs)
    infos = runtime.run(store.list_page("g/")).objects
    emulator.add_fault("compose", "stall_apply", count=hold, stall_seconds=seconds)

    async def fetch_all() -> list[list[object]]:
        groups = [infos[g * N : (g + 1) * N] for g in range(4)]
        got = await asyncio.gather(
            *(compose_fetch.fetch_group(store, g, ComposeConfig()) for g in groups)
        )
        return [list(g) for g in got]

    before = emulator.stats()["by_op"]
    counted = accounting.snapshot()
    got = runtime.run(fetch_all())
    counted = accounting.snapshot() - counted
    assert got == [[payload(g * N + i) for i in range(N)] for g in range(4)]
    assert counted.read_around == read_around
    assert emulator.stats()["by_op"].get("get", 0) - before.get("get", 0) == gets
    assert _settle(emulator, name, store) == []


def _held_window(
    emulator: Emulator, config: ComposeConfig, kind: str, hold: float
) -> tuple[str, dict[str, bytes], BucketIterableDataset]:
    """40 objects (10 read directly, then a group of 30) whose compose a ``kind`` fault holds."""
    name = f"window-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    objects = {f"d/{i:03d}": payload(i) for i in range(40)}
    emulator.seed(name, objects)
    gcs = GCSConfig(
        endpoint=emulator.endpoint, anonymous=True, retry=RETRY, hedge=HedgeConfig(enabled=False)
    )
    ds = BucketIterableDataset.from_prefix(f"gs://{name}/d/", gcs=gcs, compose=config)
    emulator.add_fault("compose", kind, count=1, stall_seconds=hold)
    return name, objects, ds


@pytest.mark.parametrize(("needed_after", "anchor"), [(2.0, True), (2.0, False), (0.0, True)])
def test_a_dataset_window_hurries_the_group_its_consumer_waits_for(
    emulator: Emulator, needed_after: float, anchor: bool, tune: Callable[..., None]
) -> None:
    # 40 objects: the window reads its first 10 directly, then one group of
    # 30, whose compose is held 2 s, far under the usual bound: the consumer,
    # waiting for that group, has it read around, unless the waited-for bound
    # is off.
    tune(**SOONER_WHEN_NEEDED, anchor=anchor)
    tune(read_around_needed_after=needed_after)
    name, objects, ds = _held_window(emulator, ComposeConfig(), "stall", 2.0)
    before = emulator.stats()["by_op"]
    got = list(ds)  # ends by draining: every compose path and delete is done
    after = emulator.stats()["by_op"]
    assert got == list(objects.values())
    assert ds.last_epoch_stats.read_around == (30 if needed_after else 0)
    gets = after.get("get", 0) - before.get("get", 0)
    composes = after.get("compose", 0) - before.get("compose", 0)
    if needed_after and anchor:
        # 10 direct, the group's 30 read around; the window's end revoked the
        # held compose (its anchor deleted): never retried, no composite.
        assert (composes, gets) == (1, 10 + 30)
    elif needed_after:
        # The held compose was waited for: retried, its composite read.
        assert (composes, gets) == (2, 10 + 30 + 1)
    else:
        assert (composes, gets) == (2, 10 + 1)
    assert after.get("put", 0) - before.get("put", 0) == (1 if anchor else 0)
    assert emulator.object_names(name, COMPOSITE_PREFIX) == []
    assert registry.in_flight() == []


def _read_held_epoch(
    emulator: Emulator, ds: BucketIterableDataset, objects: dict[str, bytes]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read one epoch of a held window; the server's counters before and after it.

    Every object arrives, and the held group's 30 were read around.
    """
    stats = emulator.stats()
    got = list(ds)
    ended = emulator.stats()
    assert got == list(objects.values())
    assert ds.last_epoch_stats.read_around == 30
    return stats, ended


def test_an_epoch_does_not_wait_for_a_compose_its_anchor_revoked(
    emulator: Emulator, tune: Callable[..., None]
) -> None:
    # The group's compose is held 3 s before the store applies it (as the
    # tail preset's stalls are, half the time). The group is read around; the
    # window's end deletes its anchor, so the epoch ends (drained) before the
    # compose is even applied; applied later, it fails, its first source gone.
    tune(**SOONER_WHEN_NEEDED)
    name, objects, ds = _held_window(emulator, ComposeConfig(), "stall_apply", 3.0)
    stats, ended = _read_held_epoch(emulator, ds, objects)
    # A request is counted when it is answered: the compose still is not.
    assert ended["by_op"].get("compose", 0) == stats["by_op"].get("compose", 0)
    assert ended["by_op"].get("put", 0) - stats["by_op"].get("put", 0) == 1  # the anchor
    # Deleted: the anchor alone; the revoked compose's composite, never made, is not.
    assert ended["by_op"].get("delete", 0) - stats["by_op"].get("delete", 0) == 1
    assert registry.in_flight() == []
    # Once the store has applied it: refused (404: a source is missing), and
    # nothing under the composites' prefix, neither composite nor anchor.
    for _ in range(100):
        now = emulator.stats()
        if now["by_op"].get("compose", 0) > stats["by_op"].get("compose", 0):
            break
        time.sleep(0.1)
    assert now["by_op"].get("compose", 0) - stats["by_op"].get("compose", 0) == 1
    assert now["by_status"].get("404", 0) > stats["by_status"].get("404", 0)
    assert emulator.object_names(name, COMPOSITE_PREFIX) == []


def test_without_an_anchor_the_epoch_waits_for_a_compose_held_before_it_was_applied(
    emulator: Emulator, tune: Callable[..., None]
) -> None:
    tune(**SOONER_WHEN_NEEDED, anchor=False)
    name, objects, ds = _held_window(emulator, ComposeConfig(), "stall_apply", 1.5)
    stats, ended = _read_held_epoch(emulator, ds, objects)
    # Waited for: the compose was applied and answered, its composite read and deleted.
    assert ended["by_op"].get("compose", 0) - stats["by_op"].get("compose", 0) == 1
    assert ended["by_op"].get("get", 0) - stats["by_op"].get("get", 0) == 10 + 30 + 1
    assert ended["by_op"].get("put", 0) == stats["by_op"].get("put", 0)
    assert emulator.object_names(name, COMPOSITE_PREFIX) == []


def test_the_tuning_is_checked_and_reaches_a_process_started_by_spawn() -> None:
    with pytest.raises(ValueError, match="read_around_after"):
        TUNING.update(read_around_after=-1)
    with pytest.raises(ValueError, match="read_around_needed_floor"):
        TUNING.update(read_around_needed_floor=float("nan"))
    with pytest.raises(ValueError, match="anchor"):
        TUNING.update(anchor="no")
    # A process that is not forked reads the tuning from its environment.
    code = "from torchbucket.compose._tuning import TUNING; print(TUNING.anchor, TUNING.read_around_after)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, ENV: "anchor=0,read_around_after=0"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.split() == ["False", "0.0"]
