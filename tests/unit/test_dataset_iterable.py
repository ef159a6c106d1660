"""BucketIterableDataset on the memory store: order, sharding, window, resume."""

from __future__ import annotations

import asyncio
import gc
import threading
import traceback
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
from memory_helper import memory_bucket
from resume_helper import check_resumable
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from wait_helper import wait_for

from torchbucket import runtime
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig
from torchbucket.datasets import BucketIterableDataset, FetchConfig, ShardingConfig
from torchbucket.datasets.catalog import Catalog
from torchbucket.errors import ConfigError, NotFoundError
from torchbucket.storage.memory import MemoryStore

N = 90


def payload(i: int) -> bytes:
    return f"sample-{i:04d}|".encode() * (1 + i % 5)


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("it", ((f"train/{i:04d}", payload(i)) for i in range(N))) as name:
        yield name


def _composites(bucket: str) -> list[str]:
    return [o.name for o in runtime.run(MemoryStore(bucket).list_page(COMPOSITE_PREFIX)).objects]


def _set_epoch(ds: BucketIterableDataset, epoch: int) -> None:
    ds.set_epoch(epoch)


def test_epoch_reads_everything_in_listing_order(bucket: str) -> None:
    ds = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/")
    assert list(ds) == [payload(i) for i in range(N)]
    assert _composites(bucket) == []


@pytest.mark.parametrize("compose", [True, False])
def test_shuffle_is_seeded_and_changes_per_epoch(bucket: str, compose: bool) -> None:
    def make() -> BucketIterableDataset:
        return BucketIterableDataset.from_prefix(
            f"memory://{bucket}/train/",
            shuffle=True,
            seed=42,
            compose=ComposeConfig(enabled=compose),
            fetch=FetchConfig(reads_in_flight=7),
        )

    a, b = make(), make()
    e0 = list(a)
    assert e0 == list(b)
    assert sorted(e0) == sorted(payload(i) for i in range(N))
    assert e0 != [payload(i) for i in range(N)]
    a.set_epoch(1)
    e1 = list(a)
    assert sorted(e1) == sorted(e0) and e1 != e0
    assert _composites(bucket) == []


def test_explicit_ranks_partition_the_epoch(bucket: str) -> None:
    seen: list[bytes] = []
    for rank in range(4):
        ds = BucketIterableDataset.from_prefix(
            f"memory://{bucket}/train/",
            shuffle=True,
            sharding=ShardingConfig(rank=rank, world_size=4),
        )
        ds.set_epoch(3)
        part = list(ds)
        assert len(part) in (N // 4, N // 4 + 1)
        seen.extend(part)
    assert sorted(seen) == sorted(payload(i) for i in range(N))


class SlowStore(MemoryStore):
    """Counts reads in flight; each read takes a little while."""

    in_flight = 0
    peak = 0
    bytes_in_flight = 0
    peak_bytes = 0

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, generation: int | None = None
    ) -> bytes:
        cls = type(self)
        size = (await self.head(key)).size
        cls.in_flight += 1
        cls.bytes_in_flight += size
        cls.peak = max(cls.peak, cls.in_flight)
        cls.peak_bytes = max(cls.peak_bytes, cls.bytes_in_flight)
        try:
            await asyncio.sleep(0.002)
            return await super().get(key, start=start, end=end, generation=generation)
        finally:
            cls.in_flight -= 1
            cls.bytes_in_flight -= size


def _slow_dataset(bucket: str, fetch: FetchConfig) -> BucketIterableDataset:
    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    catalog = Catalog([SlowStore(bucket)], [0] * len(infos), infos)
    return BucketIterableDataset(catalog, fetch=fetch, compose=ComposeConfig(enabled=False))


def test_window_keeps_many_reads_in_flight_and_no_more_than_prefetch(bucket: str) -> None:
    SlowStore.peak = 0
    assert list(_slow_dataset(bucket, FetchConfig(reads_in_flight=12))) == [
        payload(i) for i in range(N)
    ]
    assert 6 <= SlowStore.peak <= 12


def test_objects_too_large_to_compose_keep_prefetch_reads_in_flight(bucket: str) -> None:
    # With compose on, composed groups in flight are limited to prefetch // 8
    # (2 here); objects read directly are not.
    SlowStore.peak = 0
    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    catalog = Catalog([SlowStore(bucket)], [0] * len(infos), infos)
    ds = BucketIterableDataset(
        catalog,
        fetch=FetchConfig(reads_in_flight=16),
        compose=ComposeConfig(max_composite_object_size=1),
    )
    assert list(ds) == [payload(i) for i in range(N)]
    assert 6 <= SlowStore.peak <= 16


def test_window_bytes_bound_the_memory_ahead(bucket: str) -> None:
    SlowStore.peak = SlowStore.peak_bytes = 0
    largest = max(len(payload(i)) for i in range(N))
    ds = _slow_dataset(bucket, FetchConfig(reads_in_flight=64, prefetch_size=2 * largest))
    assert list(ds) == [payload(i) for i in range(N)]
    assert SlowStore.peak >= 2 and SlowStore.peak_bytes <= 2 * largest


def test_by_default_the_window_holds_at_most_128_mib_reading_directly() -> None:
    # FetchConfig(prefetch_size=None): 128 MiB of objects read directly (96
    # MiB where it composes); objects a little over 1 MiB, so that the bytes
    # bind before the 128 reads in flight do.
    assert FetchConfig().prefetch_size is None
    mib = 1 << 20
    objects = ((f"big/{i:03d}", bytes([i]) * (mib + 4096)) for i in range(160))
    with memory_bucket("window", objects) as name:
        infos = runtime.run(MemoryStore(name).list_page("big/")).objects
        catalog = Catalog([SlowStore(name)], [0] * len(infos), infos)
        SlowStore.peak = SlowStore.peak_bytes = 0
        ds = BucketIterableDataset(catalog, compose=ComposeConfig(enabled=False))
        assert [s[:1] for s in ds] == [bytes([i]) for i in range(160)]
    assert 64 * mib < SlowStore.peak_bytes <= 128 * mib


def test_by_default_the_window_holds_128_mib_of_objects_read_with_ranges() -> None:
    mib = 1 << 20
    objects = ((f"big/{i:03d}", bytes([i]) * (2 * mib)) for i in range(90))
    with memory_bucket("ranged", objects) as name:
        infos = runtime.run(MemoryStore(name).list_page("big/")).objects
        catalog = Catalog([SlowStore(name)], [0] * len(infos), infos)
        SlowStore.peak = SlowStore.peak_bytes = 0
        fetch = FetchConfig(large_object_size=2 * mib, range_size=mib)
        ds = BucketIterableDataset(catalog, fetch=fetch, compose=ComposeConfig(enabled=False))
        assert [s[:1] for s in ds] == [bytes([i]) for i in range(90)]
    # SlowStore counts each range as its object's size: at most 128 MiB of objects.
    assert 2 * 64 * mib < SlowStore.peak_bytes <= 2 * 128 * mib


def test_abandoned_iterator_stops_its_producer(bucket: str) -> None:
    ds = _slow_dataset(bucket, FetchConfig(reads_in_flight=4))
    loop = runtime.get_loop()

    async def count() -> int:
        return len(asyncio.all_tasks())

    baseline = runtime.run(count())
    for _ in range(5):
        it = iter(ds)
        next(it)
        next(it)
    del it
    ds = None
    gc.collect()
    runtime.run(asyncio.sleep(0.05))
    assert runtime.run(count()) <= baseline
    assert loop is runtime.get_loop()


def test_object_rewritten_after_listing_raises_when_reached(bucket: str) -> None:
    ds = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/")
    runtime.run(MemoryStore(bucket).put("train/0010", b"rewritten"))
    it = iter(ds)
    assert [next(it) for _ in range(10)] == [payload(i) for i in range(10)]
    with pytest.raises(NotFoundError, match="since it was listed"):
        next(it)
    assert next(it) == payload(11)
    # Mid-epoch, only the window's anchor stays: the failed group left no
    # composite, and those of the groups read ahead go as each is read (the
    # window reads the rest of this small epoch ahead of the consumer; on a
    # loaded machine some may still be in flight when this looks).
    assert wait_for(lambda: [n for n in _composites(bucket) if not n.endswith(".anchor")] == [])
    assert list(it) == [payload(i) for i in range(12, N)]
    assert _composites(bucket) == []


def _explode(data: bytes) -> bytes:
    raise ValueError("cannot decode")


def test_data_format_fn_error_names_the_uri(bucket: str) -> None:
    ds = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/", data_format_fn=_explode)
    with pytest.raises(ValueError) as info:
        next(iter(ds))
    assert f"memory://{bucket}/train/0000" in "".join(traceback.format_exception(info.value))


def test_data_format_fn_error_through_workers_names_the_uri(bucket: str) -> None:
    ds = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/", data_format_fn=_explode)
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    batches = iter(loader)
    with pytest.raises(ValueError, match=f"memory://{bucket}/train/000") as caught:
        next(batches)
    # torch re-raises from a frame that holds the iterator, in a reference
    # cycle. Left to the collector, the iterator's workers are stopped in some
    # later test after their queues were finalized: torch then waits 5 s for
    # each. Freed here, they stop at once.
    traceback.clear_frames(caught.tb)
    del batches


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("compose", [True, False])
def test_resumes_directly(bucket: str, compose: bool) -> None:
    def make() -> BucketIterableDataset:
        return BucketIterableDataset.from_prefix(
            f"memory://{bucket}/train/",
            shuffle=True,
            seed=7,
            fetch=FetchConfig(reads_in_flight=5),
            compose=ComposeConfig(enabled=compose, max_composite_object_size=200),
        )

    check_resumable(make, epochs=2, set_epoch=_set_epoch)
    assert _composites(bucket) == []


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_resumes_through_stateful_dataloader(bucket: str, workers: int, persistent: bool) -> None:
    def make() -> StatefulDataLoader:
        ds = BucketIterableDataset.from_prefix(
            f"memory://{bucket}/train/", shuffle=True, seed=3, fetch=FetchConfig(reads_in_flight=6)
        )
        return StatefulDataLoader(
            ds,
            batch_size=4,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            persistent_workers=persistent,
        )

    def set_epoch(loader: StatefulDataLoader, epoch: int) -> None:
        loader.dataset.set_epoch(epoch)

    check_resumable(make, epochs=2, set_epoch=set_epoch, key=tuple)


def test_state_of_a_resumed_epoch_without_set_epoch(bucket: str) -> None:
    def make() -> BucketIterableDataset:
        return BucketIterableDataset.from_prefix(f"memory://{bucket}/train/", shuffle=True)

    reference = make()
    reference.set_epoch(2)
    expected = list(reference)
    first = make()
    first.set_epoch(2)
    it = iter(first)
    [next(it) for _ in range(10)]
    second = make()
    second.load_state_dict(first.state_dict())
    it = iter(second)  # no set_epoch: the state's epoch is used
    assert [next(it) for _ in range(5)] == expected[10:15]
    state = second.state_dict()
    assert (state["epoch"], state["position"]) == (2, 15)
    third = make()
    third.load_state_dict(state)
    assert list(third) == expected[15:]


def test_state_from_another_dataset_or_layout_is_refused(bucket: str) -> None:
    ds = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/", shuffle=True)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    assert state["position"] == 1 and state["epoch"] == 0
    with pytest.raises(ConfigError, match="seed"):
        BucketIterableDataset.from_prefix(
            f"memory://{bucket}/train/", shuffle=True, seed=1
        ).load_state_dict(state)
    other = BucketIterableDataset.from_prefix(
        f"memory://{bucket}/train/", shuffle=True, sharding=ShardingConfig(rank=0, world_size=2)
    )
    other.load_state_dict(state)
    with pytest.raises(ConfigError, match="same number of ranks"):
        iter(other)
    with pytest.raises(ConfigError):
        ds.set_epoch(-1)


def test_state_at_the_start_resumes_with_any_layout(bucket: str) -> None:
    state = BucketIterableDataset.from_prefix(f"memory://{bucket}/train/").state_dict()
    other = BucketIterableDataset.from_prefix(
        f"memory://{bucket}/train/", sharding=ShardingConfig(rank=1, world_size=2)
    )
    other.load_state_dict(state)
    assert list(other) == [payload(i) for i in range(1, N, 2)]


def test_compose_starts_after_a_direct_first_stretch(bucket: str) -> None:
    # The first objects of a window are read directly (a first batch need
    # not wait for a compose round trip and a whole group's GET); the rest
    # are composed in groups.
    class Counting(MemoryStore):
        reads: ClassVar[list[str]] = []
        composes: ClassVar[int] = 0

        async def get(self, key: str, **kw: Any) -> bytes:
            type(self).reads.append(key)
            return await super().get(key, **kw)

        async def compose(self, destination: str, *args: Any, **kw: Any) -> Any:
            type(self).composes += 1
            return await super().compose(destination, *args, **kw)

    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    catalog = Catalog([Counting(bucket)], [0] * len(infos), infos)
    fetch = FetchConfig(reads_in_flight=16)
    ds = BucketIterableDataset(catalog, fetch=fetch, compose=ComposeConfig(max_sources=4))
    assert list(ds) == [payload(i) for i in range(N)]
    direct = [k for k in Counting.reads if k.startswith("train/")]
    assert direct == [f"train/{i:04d}" for i in range(16)]  # min(64, prefetch, N // 4)
    # Groups of 3: the window's anchor takes the first of max_sources=4.
    assert Counting.composes == -(-(N - 16) // 3)
    Counting.reads.clear()
    small = BucketIterableDataset(
        Catalog([Counting(bucket)], [0] * 20, infos[:20]),
        fetch=FetchConfig(reads_in_flight=16),
        compose=ComposeConfig(max_sources=4),
    )
    assert list(small) == [payload(i) for i in range(20)]
    assert [k for k in Counting.reads if k.startswith("train/")] == [
        f"train/{i:04d}"
        for i in range(5)  # a quarter of a small window
    ]
    assert _composites(bucket) == []


def test_a_slow_consumer_holds_at_most_a_chunk_beyond_the_window(bucket: str) -> None:
    # What take() hands over leaves the window's count: handing over all that
    # had arrived let the consumer's backlog grow to another window (500+
    # objects of 100 KiB per DataLoader worker in a benchmark).
    import time

    from torchbucket.datasets._fetch import PrefetchWindow

    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    catalog = Catalog([MemoryStore(bucket)], [0] * len(infos), infos)
    order = np.arange(len(infos))
    window = PrefetchWindow(
        catalog, order, 0, FetchConfig(reads_in_flight=8), ComposeConfig(enabled=False)
    )
    window.start()
    try:
        pos = 0
        got: list[object] = []
        while pos < len(infos):
            time.sleep(0.002)  # the fetchers fill the window meanwhile
            chunk = window.take(pos)
            assert 1 <= len(chunk) <= 2  # min(32, prefetch // 4)
            got += chunk
            pos += len(chunk)
        assert got == [payload(i) for i in range(N)]
    finally:
        window.close()


def test_an_overtaken_read_is_hedged_only_once_slower_than_twice_the_recent_median(
    bucket: str,
) -> None:
    # Overtaking alone is no straggler where the window holds few objects: at
    # 16 MiB (8 a window) the latency tail's jitter reordered reads running
    # side by side, and 9-17 of an epoch's 256 ranged GETs were hedged
    # within their own wait. The window asks an overtaken read to hedge after
    # twice the median of its recent reads, and not before it knows one.
    from torchbucket.datasets._fetch import PrefetchWindow

    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    catalog = Catalog([MemoryStore(bucket)], [0] * len(infos), infos)
    window = PrefetchWindow(
        catalog,
        np.arange(len(infos)),
        0,
        FetchConfig(reads_in_flight=8),
        ComposeConfig(enabled=False),
    )
    asked: list[float] = []

    class Reads:
        def hurry(self, after: float) -> None:
            asked.append(after)

    window._reads_in_flight[5] = Reads()  # type: ignore[assignment]
    overtaken = window._overtaken
    window._hurry_read(5, overtaken + 10)
    assert asked == []  # no read timed yet: the read waits its own wait
    for seconds in (0.1, 0.3, 0.2, 0.2, 0.1, 0.4, 0.2):
        window._timed(seconds)
    window._hurry_read(5, overtaken)
    assert asked == []  # seven timed: too few for a median
    window._timed(0.2)
    window._hurry_read(5, overtaken - 1)
    assert asked == []  # not overtaken enough
    window._hurry_read(5, overtaken)
    assert asked == [pytest.approx(0.4)]  # twice the median of the eight


def test_a_window_of_few_objects_hands_over_what_arrived_without_waiting_for_all(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A waiting consumer is woken once a chunk (32) has arrived in order, or
    # everything admitted has. Where the window holds fewer objects than a
    # chunk (at 16 MiB it holds 8), it slept until the last admitted object
    # arrived: no read began meanwhile, and under the latency tail the
    # iterable's epoch at 64 MiB ran 1.24-1.43x slower than under the
    # constant preset. Now the chunk is at most a quarter of what it holds.
    # (The consumer's once-a-second look for a vanished parent would also
    # wake it: set past the late object's delay, it hides nothing here.)
    from torchbucket.datasets._fetch import PrefetchWindow

    late = "train/0005"
    arrived = threading.Event()

    class Late(MemoryStore):
        async def get(self, key: str, **kw: Any) -> bytes:
            if key == late:
                await asyncio.sleep(3.0)
                arrived.set()
            return await super().get(key, **kw)

    monkeypatch.setattr(runtime, "PARENT_CHECK_S", 60.0)
    infos = runtime.run(MemoryStore(bucket).list_page("train/")).objects
    catalog = Catalog([Late(bucket)], [0] * len(infos), infos)
    largest = max(info.size for info in infos)
    window = PrefetchWindow(
        catalog,
        np.arange(len(infos)),
        0,
        FetchConfig(prefetch_size=8 * largest),  # 8 objects or more, fewer than 32
        ComposeConfig(enabled=False),
    )
    window.start()
    try:
        first = window.take(0)
        assert not arrived.is_set(), "the consumer waited for the late object"
        assert 1 <= len(first) < 5
        assert first == [payload(i) for i in range(len(first))]
        got = list(first)
        while len(got) < N:
            got += window.take(len(got))
        assert got == [payload(i) for i in range(N)]
    finally:
        window.close()


def test_waiting_fetchers_hold_no_bytes_outside_the_window() -> None:
    # Each of the prefetch fetchers kept its last group's bytes while it
    # waited for room in a full window: up to prefetch x a group outside the
    # window's bounds (measured: 130 groups, 416 MB per DataLoader worker).
    import time
    import tracemalloc

    size, count = 64 * 1024, 1024
    objects = ((f"h/{i:04d}", bytes([i % 256]) * size) for i in range(count))
    with memory_bucket("hold", objects) as name:
        ds = BucketIterableDataset.from_prefix(
            f"memory://{name}/h/",
            fetch=FetchConfig(reads_in_flight=64, prefetch_size=2 << 20),
            compose=ComposeConfig(max_sources=8),
        )
        tracemalloc.start()
        try:
            got = 0
            for data in ds:
                got += len(data)
                time.sleep(0.0005)  # a slow consumer: the window stays full
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert got == count * size
        # The window (2 MiB), the groups in flight (8 x 512 KiB, each
        # composed and read once) and the pool; not 64 fetchers x 512 KiB.
        assert peak < 12 << 20, f"peak {peak / 2**20:.1f} MiB"
