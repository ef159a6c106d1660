"""Small-object coalescing on the memory store: planning, compose, fallbacks, cleanup."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.compose import (
    COMPOSITE_PREFIX,
    ComposeConfig,
    cleanup_composites,
    fetch_group,
    plan_groups,
)
from torchbucket.compose import _composite as compose_composite
from torchbucket.compose import _fetch as compose_fetch
from torchbucket.compose.registry import cleanup_registered, drain_deletes, in_flight
from torchbucket.errors import (
    ConfigError,
    IntegrityError,
    NotFoundError,
    PermissionDeniedError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.memory import MemoryStore


class CountingStore(MemoryStore):
    """A memory store that counts calls and can fail compose or delete."""

    def __init__(self, bucket: str, *, compose_error: StorageError | None = None) -> None:
        super().__init__(bucket)
        self.compose_error = compose_error
        self.compose_after_effect = False  # fail after the composite was made
        self.delete_errors: list[StorageError] = []
        self.calls: dict[str, int] = {"compose": 0, "get": 0, "delete": 0}

    async def compose(
        self,
        destination: str,
        sources: Sequence[ObjectInfo],
        *,
        if_generation_match: int | None = None,
    ) -> ObjectInfo:
        self.calls["compose"] += 1
        if self.compose_error is not None and not self.compose_after_effect:
            raise self.compose_error
        info = await super().compose(destination, sources, if_generation_match=if_generation_match)
        if self.compose_error is not None:
            raise self.compose_error
        return info

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, generation: int | None = None
    ) -> bytes:
        self.calls["get"] += 1
        return await super().get(key, start=start, end=end, generation=generation)

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        self.calls["delete"] += 1
        if self.delete_errors:
            raise self.delete_errors.pop(0)
        await super().delete(key, generation=generation)


@pytest.fixture
def bucket() -> str:
    with memory_bucket("compose") as name:
        yield name


@pytest.fixture(autouse=True)
def _fresh_compose_state() -> None:
    compose_fetch._refused.clear()
    compose_fetch._cooldown_until.clear()
    compose_fetch._warned.clear()


def _seed(store: MemoryStore, n: int, size: int = 100) -> list[ObjectInfo]:
    async def put_all() -> list[ObjectInfo]:
        return [await store.put(f"data/{i:04d}", bytes([i % 251]) * (size + i)) for i in range(n)]

    return runtime.run(put_all())


def _composites(store: MemoryStore) -> list[str]:
    return [o.name for o in runtime.run(store.list_page(COMPOSITE_PREFIX)).objects]


# ---------------------------------------------------------------- planning


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5000), max_size=300),
    cap=st.integers(min_value=0, max_value=20000),
    max_sources=st.integers(min_value=1, max_value=32),
)
def test_plan_covers_every_object_once_within_the_caps(
    sizes: list[int], cap: int, max_sources: int
) -> None:
    groups = plan_groups(sizes, max_composite_object_size=cap, max_sources=max_sources)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    for group in groups:
        assert len(group) >= 1
        if len(group) > 1:
            assert len(group) <= max_sources
            assert sum(sizes[i] for i in group) <= cap
    # Greedy: a group is only closed when the next object would not fit.
    for group, nxt in itertools.pairwise(groups):
        small = all(sizes[i] <= cap for i in group) and cap > 0
        if small and sizes[nxt.start] <= cap:
            assert (
                len(group) == max_sources or sum(sizes[i] for i in group) + sizes[nxt.start] > cap
            )


def test_plan_groups_of_32_and_large_objects_alone() -> None:
    sizes = [10] * 100 + [5000] + [10] * 3
    groups = plan_groups(sizes, max_composite_object_size=1000)
    assert [len(g) for g in groups] == [32, 32, 32, 4, 1, 3]
    assert groups[4] == range(100, 101)


def test_plan_with_zero_cap_reads_everything_directly() -> None:
    assert plan_groups([1, 2, 3], max_composite_object_size=0) == [
        range(0, 1),
        range(1, 2),
        range(2, 3),
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_composite_object_size": -1},
        {"max_sources": 33},
        {"max_sources": 1},
        {"composite_prefix": "elsewhere/"},
        {"composite_prefix": COMPOSITE_PREFIX + "job"},
        {"throttle_cooldown": -1.0},
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ComposeConfig(**kwargs)  # type: ignore[arg-type]


def test_enabled_is_the_one_switch() -> None:
    assert ComposeConfig().enabled
    assert not ComposeConfig(enabled=False).enabled
    # A cap of 0 is dataflux's way (torchbucket.dataflux maps it); here it is refused.
    with pytest.raises(ConfigError, match="max_composite_object_size must be"):
        ComposeConfig(max_composite_object_size=0)
    with pytest.raises(ConfigError, match=r"ComposeConfig\.enabled must be True or False"):
        ComposeConfig(enabled="no")  # type: ignore[arg-type]


# ---------------------------------------------------------------- fetching


def test_group_is_composed_read_once_split_and_deleted(bucket: str) -> None:
    store = CountingStore(bucket)
    infos = _seed(store, 10)
    expected = [runtime.run(MemoryStore(bucket).get(i.name)) for i in infos]
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert got == expected
    assert store.calls == {"compose": 1, "get": 1, "delete": 1}
    assert _composites(store) == []
    assert in_flight() == []


class _ArrayDestination:
    """A composite received into one bytearray; its objects are memoryviews of it."""

    made: list[bytearray] = []

    def __init__(self, size: int) -> None:
        self.array = bytearray(size)
        self.made.append(self.array)

    @property
    def view(self) -> memoryview:
        return memoryview(self.array)

    def piece(self, start: int, stop: int) -> memoryview:
        return memoryview(self.array)[start:stop]


def test_group_received_into_a_destination_comes_back_as_its_pieces(bucket: str) -> None:
    store = CountingStore(bucket)
    infos = _seed(store, 10)
    expected = [runtime.run(MemoryStore(bucket).get(i.name)) for i in infos]
    _ArrayDestination.made = []
    got = runtime.run(fetch_group(store, infos, ComposeConfig(), receive_into=_ArrayDestination))
    assert [bytes(g) for g in got] == expected
    # One destination of the composite's size; every object a view of it, no copy.
    (array,) = _ArrayDestination.made
    assert len(array) == sum(i.size for i in infos)
    assert all(isinstance(g, memoryview) and g.obj is array for g in got)
    assert store.calls == {"compose": 1, "get": 1, "delete": 1}
    assert _composites(store) == []


def test_group_bytes_come_back_before_the_composite_is_deleted(bucket: str) -> None:
    class SlowDelete(CountingStore):
        release: asyncio.Event | None = None

        async def delete(self, key: str, *, generation: int | None = None) -> None:
            assert self.release is not None
            await self.release.wait()
            await super().delete(key, generation=generation)

    store = SlowDelete(bucket)
    infos = _seed(store, 6)

    async def fetch() -> list[bytes | BaseException]:
        store.release = asyncio.Event()
        return await fetch_group(store, infos, ComposeConfig())

    got = runtime.run(fetch())
    assert got == [bytes([i]) * (100 + i) for i in range(6)]
    # The delete runs in the background; the registry covers it meanwhile.
    assert len(_composites(store)) == 1
    assert in_flight() == [store.uri(_composites(store)[0])]
    assert store.release is not None
    runtime.get_loop().call_soon_threadsafe(store.release.set)
    runtime.run(drain_deletes())
    assert _composites(store) == [] and in_flight() == []


def test_job_sub_prefix_is_used_and_cleaned(bucket: str) -> None:
    store = CountingStore(bucket)
    infos = _seed(store, 3)
    config = ComposeConfig(composite_prefix=COMPOSITE_PREFIX + "job7/")
    names: list[str] = []
    original = MemoryStore.compose

    async def spy(self: MemoryStore, destination: str, *args: object, **kw: object) -> ObjectInfo:
        names.append(destination)
        return await original(self, destination, *args, **kw)  # type: ignore[arg-type]

    store.compose = spy.__get__(store)  # type: ignore[method-assign]
    runtime.run(fetch_group(store, infos, config))
    assert names and names[0].startswith(COMPOSITE_PREFIX + "job7/")
    assert _composites(store) == []


def test_object_rewritten_since_listing_raises_not_found_never_new_bytes(bucket: str) -> None:
    store = CountingStore(bucket)
    infos = _seed(store, 5)
    runtime.run(store.put(infos[2].name, b"new bytes of another length"))
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert isinstance(got[2], NotFoundError)
    assert store.uri(infos[2].name) in str(got[2])
    assert "since it was listed" in got[2].message
    for i in (0, 1, 3, 4):
        assert got[i] == bytes([i % 251]) * (100 + i)
    assert _composites(store) == []


def test_object_changed_without_generation_is_an_integrity_error(bucket: str) -> None:
    store = CountingStore(bucket)
    infos = [ObjectInfo(i.name, i.size, None) for i in _seed(store, 3)]
    runtime.run(store.put(infos[1].name, b"x"))
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert isinstance(got[1], IntegrityError)
    assert got[0] == bytes([0]) * 100
    assert _composites(store) == []


def test_compose_refused_falls_back_with_one_warning(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = CountingStore(
        bucket, compose_error=PermissionDeniedError("denied", operation="compose", status=403)
    )
    infos = _seed(store, 8)
    with caplog.at_level(logging.WARNING, logger="torchbucket"):
        first = runtime.run(fetch_group(store, infos[:4], ComposeConfig()))
        second = runtime.run(fetch_group(store, infos[4:], ComposeConfig()))
    assert first + second == [bytes([i]) * (100 + i) for i in range(8)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "compose refused" in warnings[0].getMessage()
    assert store.calls["compose"] == 1  # refused once, not asked again
    assert store.calls["delete"] == 0
    assert in_flight() == []


def test_compose_throttled_falls_back_and_cools_down(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = CountingStore(bucket, compose_error=ThrottledError("slow down", status=429))
    infos = _seed(store, 6)
    with caplog.at_level(logging.WARNING, logger="torchbucket"):
        got = runtime.run(fetch_group(store, infos[:3], ComposeConfig()))
        got += runtime.run(fetch_group(store, infos[3:], ComposeConfig()))
    assert got == [bytes([i]) * (100 + i) for i in range(6)]
    assert store.calls["compose"] == 1
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    store.compose_error = None
    runtime.run(fetch_group(store, infos[:3], ComposeConfig(throttle_cooldown=0.0)))
    assert _composites(store) == []


def test_compose_answer_lost_after_it_took_effect_leaves_nothing(bucket: str) -> None:
    store = CountingStore(bucket, compose_error=TransientError("connection reset"))
    store.compose_after_effect = True
    infos = _seed(store, 4)
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert got == [bytes([i]) * (100 + i) for i in range(4)]
    assert _composites(store) == []


def test_failed_delete_stays_registered_until_cleanup(bucket: str) -> None:
    store = CountingStore(bucket)
    store.delete_errors.append(TransientError("reset", operation="delete"))
    infos = _seed(store, 4)
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert got == [bytes([i]) * (100 + i) for i in range(4)]
    assert len(_composites(store)) == 1
    assert in_flight() == [store.uri(_composites(store)[0])]
    assert runtime.run(cleanup_registered()) == 1
    assert _composites(store) == [] and in_flight() == []


def test_cleanup_composites_deletes_only_composites(bucket: str) -> None:
    store = MemoryStore(bucket)
    _seed(store, 3)

    async def leave() -> None:
        for i in range(1205):  # more than one listing page
            await store.put(f"{COMPOSITE_PREFIX}{i:05d}", b"x")
        await store.put(f"{COMPOSITE_PREFIX}job1/a", b"x")

    runtime.run(leave())
    assert runtime.run(cleanup_composites(store, prefix="job1/")) == 1
    assert runtime.run(cleanup_composites(store)) == 1205
    assert _composites(store) == []
    assert len(runtime.run(store.list_page("data/")).objects) == 3


# ------------------------------------------------------- receive buffers


def test_composite_buffers_are_reused_and_never_leak_bytes(bucket: str) -> None:
    # Groups of shrinking size through one pooled buffer: each gets exactly
    # its own bytes, never a byte left over from the larger group before it.
    store = CountingStore(bucket)
    infos = _seed(store, 12, size=3000)
    compose_composite._pool.clear()
    expected = [bytes([i % 251]) * (3000 + i) for i in range(12)]
    for stop in (12, 7, 3):
        got = runtime.run(fetch_group(store, infos[:stop], ComposeConfig()))
        assert got == expected[:stop]
        assert all(type(b) is bytes for b in got)
    assert len(compose_composite._pool._free) == 1  # one buffer served all three
    assert _composites(store) == []


def test_a_failed_composite_read_gives_its_buffer_back_and_reads_directly(bucket: str) -> None:
    class BrokenRead(CountingStore):
        async def get_into(self, key: str, buffer: memoryview, **kw: object) -> int:
            if key.startswith(COMPOSITE_PREFIX):
                buffer[:4] = b"junk"
                raise TransientError("connection reset", operation="get")
            return await super().get_into(key, buffer, **kw)  # type: ignore[arg-type]

    store = BrokenRead(bucket)
    infos = _seed(store, 5)
    compose_composite._pool.clear()
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert got == [bytes([i]) * (100 + i) for i in range(5)]
    assert len(compose_composite._pool._free) == 1
    assert _composites(store) == []


def test_a_composite_of_another_size_is_not_read(bucket: str) -> None:
    class WrongSize(CountingStore):
        async def compose(self, destination: str, *args: object, **kw: object) -> ObjectInfo:
            info = await super().compose(destination, *args, **kw)  # type: ignore[arg-type]
            return ObjectInfo(info.name, info.size + 1, info.generation)

    store = WrongSize(bucket)
    infos = _seed(store, 4)
    got = runtime.run(fetch_group(store, infos, ComposeConfig()))
    assert got == [bytes([i]) * (100 + i) for i in range(4)]
    assert store.calls["get"] == 4  # the four sources, not the composite
    assert _composites(store) == []


def test_the_pool_keeps_a_bounded_amount() -> None:
    pool = compose_composite._BufferPool()
    big = pool.take(compose_composite._POOL_MAX_BUFFER + 1)
    pool.give(big)
    assert pool._free == []  # too large to keep
    buffers = [pool.take(8 << 20) for _ in range(20)]
    for b in buffers:
        pool.give(b)
    assert sum(len(b) for b in pool._free) <= compose_composite._POOL_MAX_BYTES
    assert len(pool.take(100)) == 8 << 20  # the smallest buffer that fits
