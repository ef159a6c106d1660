"""The compose window's depth, and a straggling composite delete (issue 19).

On the memory store, with a compose held by the test: how many groups are in
flight and how far the window runs ahead while the group at its head waits;
and a composite's delete whose first request answers late (or never) is sent
again and counted done at the first answer, a 404 included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.compose import ComposeConfig, registry
from torchbucket.compose._tuning import tuned
from torchbucket.datasets import FetchConfig
from torchbucket.datasets import _units as units_module
from torchbucket.datasets._fetch import PrefetchWindow
from torchbucket.datasets.catalog import Catalog
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.memory import MemoryStore

N = 1000


def payload(i: int) -> bytes:
    return f"w-{i:05d};".encode()


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("cw", ((f"s/{i:05d}", payload(i)) for i in range(N))) as name:
        yield name


class HeldCompose(MemoryStore):
    """The first compose waits until released; the others take a moment."""

    started: ClassVar[int] = 0
    composing: ClassVar[int] = 0
    peak: ClassVar[int] = 0
    release: ClassVar[threading.Event] = threading.Event()

    async def compose(self, destination: str, sources: Any, **kw: Any) -> ObjectInfo:
        cls = type(self)
        cls.started += 1
        first = cls.started == 1
        cls.composing += 1
        cls.peak = max(cls.peak, cls.composing)
        try:
            if first:
                while not cls.release.is_set():
                    await asyncio.sleep(0.005)
            else:
                await asyncio.sleep(0.01)
            return await super().compose(destination, sources, **kw)
        finally:
            cls.composing -= 1


def _held_window(bucket: str, prefetch: int, expect: int) -> tuple[PrefetchWindow, int]:
    """A window whose first group is held; the composes started once it has settled.

    Settled: ``expect`` composes started, or none more for 2 s; then 0.3 s
    more for any beyond ``expect``.
    """
    HeldCompose.started = HeldCompose.composing = HeldCompose.peak = 0
    HeldCompose.release = threading.Event()
    infos = runtime.run(MemoryStore(bucket).list_page("s/")).objects
    catalog = Catalog([HeldCompose(bucket)], [0] * len(infos), infos)
    window = PrefetchWindow(
        catalog, np.arange(len(infos)), 0, FetchConfig(reads_in_flight=prefetch), ComposeConfig()
    )
    window.start()
    # Nothing is taken: the window fills behind its held head group, then stops.
    seen, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and seen < expect:
        now = HeldCompose.started
        if now != seen:
            seen, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 2.0:
            break
        time.sleep(0.02)
    time.sleep(0.3)
    return window, HeldCompose.started


def _drain(window: PrefetchWindow) -> list[object]:
    HeldCompose.release.set()
    got: list[object] = []
    try:
        while len(got) < N:
            got += window.take(len(got))
    finally:
        window.close()
    runtime.run(registry.drain_deletes())
    return got


def test_small_objects_get_more_groups_in_flight_and_a_deeper_window(bucket: str) -> None:
    # prefetch 8: the first 8 objects are read directly, then groups of 32.
    # Small groups: prefetch // 2 = 4 in flight (was prefetch // 8 = 1, at
    # least 2), and the window runs 4 rounds of them ahead, 512 objects (was
    # 2 rounds, 128): the groups ending by position 512 are composed while
    # the first waits.
    window, started = _held_window(bucket, prefetch=8, expect=(512 - 8) // 32)
    assert HeldCompose.peak == 4
    assert started == (512 - 8) // 32
    assert _drain(window) == [payload(i) for i in range(N)]


def test_large_groups_keep_the_shallow_window(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Groups of 32 x 8 bytes = 256 bytes; bounds of 512 bytes in flight and
    # 1,024 bytes ahead stand in for 96 and 128 MiB against 256 KiB objects:
    # 2 groups in flight, and the window 2 rounds of them (128 objects) ahead.
    monkeypatch.setattr(units_module, "_GROUP_BYTES_IN_FLIGHT", 512)
    monkeypatch.setattr(units_module, "_BYTES_AHEAD", 1024)
    window, started = _held_window(bucket, prefetch=16, expect=(128 - 16) // 32)
    assert HeldCompose.peak == 2
    assert started == (128 - 16) // 32
    assert _drain(window) == [payload(i) for i in range(N)]


class LateDelete(MemoryStore):
    """The first delete takes effect at once but answers only when released."""

    deletes: ClassVar[int] = 0
    release: ClassVar[asyncio.Event | None] = None

    async def delete(self, key: str, *, generation: int | None = None) -> None:
        cls = type(self)
        cls.deletes += 1
        if cls.deletes == 1:
            await super().delete(key, generation=generation)
            assert cls.release is not None
            await cls.release.wait()  # the answer is late
            return
        await super().delete(key, generation=generation)


def test_a_late_delete_is_sent_again_and_the_404_counts_as_gone(bucket: str) -> None:
    store = LateDelete(bucket)
    info = runtime.run(store.put("dataflux-composed-objects/late", b"x" * 10))

    async def delete() -> object:
        LateDelete.deletes = 0
        LateDelete.release = asyncio.Event()
        registry.register(store, info.name)
        try:
            return await registry.delete_composite(
                store, info.name, info.generation, resend_after=4.0, resend_floor=0.05
            )
        finally:
            LateDelete.release.set()

    assert runtime.run(delete(), timeout=60) is None
    assert LateDelete.deletes == 2
    assert registry.in_flight() == []
    assert runtime.run(store.list_page("dataflux-composed-objects/")).objects == []


def test_without_resend_a_late_delete_is_waited_for(bucket: str) -> None:
    store = LateDelete(bucket)
    info = runtime.run(store.put("dataflux-composed-objects/late", b"x" * 10))

    async def delete() -> tuple[bool, int]:
        LateDelete.deletes = 0
        LateDelete.release = asyncio.Event()
        task = asyncio.ensure_future(registry.delete_composite(store, info.name, info.generation))
        await asyncio.sleep(0.3)
        waiting = not task.done()
        LateDelete.release.set()
        await task
        return waiting, LateDelete.deletes

    assert runtime.run(delete(), timeout=60) == (True, 1)


class HeldReads(MemoryStore):
    """Every compose, and every read of one object, wait until released."""

    held_name: ClassVar[str] = ""
    reads: ClassVar[threading.Event] = threading.Event()
    composes: ClassVar[threading.Event] = threading.Event()

    async def get(self, key: str, **kw: Any) -> bytes:
        while key == type(self).held_name and not type(self).reads.is_set():
            await asyncio.sleep(0.005)
        return await super().get(key, **kw)

    async def compose(self, destination: str, sources: Any, **kw: Any) -> ObjectInfo:
        while not type(self).composes.is_set():
            await asyncio.sleep(0.005)
        return await super().compose(destination, sources, **kw)


def test_a_consumer_taking_what_there_is_is_not_held_for_the_next_group(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 64 objects read directly, then composed groups, every compose held. The
    # consumer waits at position 40, whose read is held too; once it arrives,
    # the results in order reach position 64, where the first group (in
    # flight) begins: short of the consumer's chunk (40 + 32), but all there is
    # until that group's compose path ends. (It slept until then: an
    # iterable dataset's first batch waited for the first compose path.)
    # Reading a group around is off: nothing but its compose path brings it;
    # nor does the consumer's check on its parent process wake it meanwhile.
    monkeypatch.setattr(runtime, "PARENT_CHECK_S", 60.0)
    stack = contextlib.ExitStack()
    stack.enter_context(tuned(read_around_after=0, read_around_needed_after=0))
    infos = runtime.run(MemoryStore(bucket).list_page("s/")).objects
    HeldReads.held_name = infos[40].name
    HeldReads.reads, HeldReads.composes = threading.Event(), threading.Event()
    catalog = Catalog([HeldReads(bucket)], [0] * len(infos), infos)
    window = PrefetchWindow(
        catalog, np.arange(len(infos)), 0, FetchConfig(reads_in_flight=128), ComposeConfig()
    )
    window.start()
    try:
        deadline = time.monotonic() + 30
        while len(window._results) < 63 and time.monotonic() < deadline:
            time.sleep(0.01)  # every direct read but position 40's has arrived
        got = window.take(0)
        got += window.take(len(got))
        assert got == [payload(i) for i in range(40)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(window.take, 40)
            while window._waiting_for != 40 and time.monotonic() < deadline:
                time.sleep(0.01)
            HeldReads.reads.set()
            assert waiting.result(timeout=20) == [payload(i) for i in range(40, 64)]
        assert not HeldReads.composes.is_set()
    finally:
        HeldReads.reads.set()
        HeldReads.composes.set()
        stack.close()
    got += [payload(i) for i in range(40, 64)]
    while len(got) < N:
        got += window.take(len(got))
    window.close()
    runtime.run(registry.drain_deletes())
    assert got == [payload(i) for i in range(N)]
