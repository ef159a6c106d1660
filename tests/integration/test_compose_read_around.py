"""A group whose compose straggles is read object by object meanwhile (issue 19).

Over HTTP against the emulator: the group's first compose is held by the
server (a ``stall`` fault, then the connection reset, which the client retries).
A composite's delete held the same way is sent again.
With ``read_around_after`` on, the group's objects are read directly while the
compose path goes on; the compose path still ends by deleting its composite.
With it off, the group waits for the compose's retry. Request counts, not times,
tell the two apart.
"""

from __future__ import annotations

import uuid

import pytest

from torchbucket import runtime
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig, registry
from torchbucket.compose import _fetch as compose_fetch
from torchbucket.compose.registry import drain_deletes
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator

N = 8
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=30.0, attempt_timeout=20.0, read_timeout=10.0
)


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


def _settle(emulator: Emulator, bucket: str, store: GCSStore) -> list[str]:
    """Wait for compose paths left running and their deletes; the composites left."""
    runtime.run(drain_deletes(), timeout=60)
    assert not registry._pending
    runtime.run(store.close())
    return emulator.object_names(bucket, COMPOSITE_PREFIX)


def test_a_stalled_compose_is_read_around_and_its_composite_still_deleted(
    emulator: Emulator, bucket: str
) -> None:
    emulator.add_fault("compose", "stall", count=1, stall_seconds=3.0)
    before = emulator.stats()["by_op"]
    config = ComposeConfig(read_around_floor=0.2)
    got, store = _group(emulator, bucket, config)
    assert got == [payload(i) for i in range(N)]
    left = _settle(emulator, bucket, store)
    after = emulator.stats()["by_op"]
    # Each object was read directly while the compose was held ...
    gets = after.get("get", 0) - before.get("get", 0)
    assert gets >= N
    # ... and the compose path went on: retried, read and deleted its composite.
    assert after.get("compose", 0) - before.get("compose", 0) == 2
    assert left == []


def test_with_read_around_off_the_group_waits_for_its_compose(
    emulator: Emulator, bucket: str
) -> None:
    emulator.add_fault("compose", "stall", count=1, stall_seconds=1.5)
    before = emulator.stats()["by_op"]
    got, store = _group(emulator, bucket, ComposeConfig(read_around_after=0))
    assert got == [payload(i) for i in range(N)]
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
    got, store = _group(emulator, bucket, ComposeConfig(read_around_floor=0.2), retry)
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
    got, store = _group(emulator, bucket, ComposeConfig(read_around_floor=0.2), retry)
    assert got == [payload(i) for i in range(N)]
    runtime.run(drain_deletes(), timeout=60)
    after = emulator.stats()["by_op"]
    assert after.get("delete", 0) - before.get("delete", 0) == 2
    assert emulator.object_names(bucket, COMPOSITE_PREFIX) == []
    runtime.run(store.close())


def test_read_around_settings_are_checked() -> None:
    from torchbucket.errors import ConfigError

    with pytest.raises(ConfigError, match="read_around_after"):
        ComposeConfig(read_around_after=-1)
