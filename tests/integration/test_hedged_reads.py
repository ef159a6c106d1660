"""Hedged reads against the emulator (``storage/gcs/_hedge.py``), on both bucket kinds.

A read held by a stalled request completes through its hedge, with the exact
bytes, and the hedge is counted; hedges stay within their budget; a stall
longer than ``read_timeout`` ends in a retry and then an error naming the URI,
hedging on or off. On a zonal bucket the requests are gRPC bidi read streams
(``storage/gcs/_grpc_hedge.py``): the hedge goes on a stream of its own and the
stalled stream is cancelled once the hedge has answered. The stall rules match
by name: a stream's open and each of its ranges count as a "get" each. No
assertion on how fast anything ran.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from torch.utils.data import DataLoader

from torchbucket import accounting, runtime
from torchbucket.compose import ComposeConfig
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketBatchSampler, BucketIterableDataset, BucketMapDataset
from torchbucket.emulator import LatencyModel
from torchbucket.errors import DeadlineExceededError
from torchbucket.storage.gcs import GCSConfig

pytestmark = pytest.mark.emulator

MiB = 1 << 20
DATA = random.Random(19).randbytes(2 * MiB + 17)
# One attempt: a read the hedge does not rescue fails (the stall ends in a reset).
ONE_ATTEMPT = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=60.0, read_timeout=60.0, max_attempts=1
)
# Hedge the first slow read: a budget of one hedge per read, a short wait
# (small reads: until 4 reads of their size are known; ranges of 1 MiB and
# more: once they are).
EAGER = HedgeConfig(budget=1.0, burst=1.0, initial_wait=0.2, floor=0.2, min_samples=4)


def _server_gets(emu: Any) -> int:
    return int(emu.stats()["by_op"].get("get", 0))


def _eventually(check: Callable[[], bool], within: float = 10.0) -> bool:
    """Whether ``check()`` holds within ``within`` seconds (polled)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("how", ["get", "get_into"])
def test_a_stalled_read_completes_through_its_hedge(
    emulator: Any, gcs_bucket_factory: Any, bucket_kind: str, how: str
) -> None:
    store = gcs_bucket_factory(emulator, prefix="hedge", retry=ONE_ATTEMPT, hedge=EAGER)
    runtime.run(store.put("obj", DATA))

    def read() -> None:
        if how == "get":  # a dataset's read of a sample
            assert runtime.run(store.get("obj", start=5, end=5 + 100_000)) == DATA[5:100_005]
        else:  # a checkpoint load's path: a 2 MiB range into a buffer, in place
            buffer = bytearray(2 * MiB)
            n = runtime.run(store.get_into("obj", memoryview(buffer), start=17))
            assert n == 2 * MiB and bytes(buffer) == DATA[17:]

    for _ in range(4):  # the reads of this size the wait is learnt from
        read()
    emulator.reset_stats()
    emulator.add_fault("get", "stall", match="obj", stall_seconds=30.0)
    before = accounting.snapshot()
    read()
    spent = accounting.snapshot() - before
    assert spent.hedges == 1
    assert spent.retries == 0
    # The stalled request and its hedge both reached the server, both GETs (class B):
    # on a zonal bucket, two streams (the hedge did not go on the stalled one).
    assert spent.by_op.get("get") == 2
    assert _server_gets(emulator) == 2
    assert emulator.faults()[0]["fired"] == 1
    if bucket_kind == "zonal":
        # The stalled stream was cancelled by the client (the server records a
        # 499), not left running until its 30 s stall ends (an UNAVAILABLE);
        # the hedge's stream ended as a finished read does, not cancelled.
        assert _eventually(lambda: emulator.stats()["by_status"].get("499", 0) >= 1)
        assert emulator.stats()["by_status"].get("499") == 1


def test_without_hedging_the_same_stall_fails_the_read(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    # The check that the test above tests the hedge: the stall alone fails a read.
    store = gcs_bucket_factory(
        emulator,
        prefix="nohedge",
        retry=RetryConfig(max_attempts=1, read_timeout=1.0),
        hedge=HedgeConfig(enabled=False),
    )
    runtime.run(store.put("obj", DATA))
    emulator.add_fault("get", "stall", match="obj", stall_seconds=3.0)
    with pytest.raises(DeadlineExceededError) as info:
        runtime.run(store.get("obj", start=5, end=5 + MiB))
    assert f"gs://{store.bucket}/obj" in str(info.value)


def test_hedges_stay_within_their_budget_and_are_all_counted(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    budget = HedgeConfig(budget=0.05, burst=2.0, initial_wait=0.05, floor=0.05, min_samples=16)
    store = gcs_bucket_factory(emulator, prefix="budget", hedge=budget)
    names = [f"o{i:04d}" for i in range(400)]
    emulator.seed(store.bucket, ((n, n.encode() * 100) for n in names))
    # One read in five stalls: far more slow reads than the budget may hedge.
    emulator.set_latency(
        LatencyModel(read=0.001, list_page=0.001, write=0.001, stall_probability=0.2,
                     stall_seconds=0.3, seed=4)
    )  # fmt: skip
    emulator.reset_stats()
    before = accounting.snapshot()

    async def read_all() -> list[bytes]:
        limit = asyncio.Semaphore(32)

        async def one(name: str) -> bytes:
            async with limit:
                return await store.get(name)

        return await asyncio.gather(*(one(n) for n in names))

    assert runtime.run(read_all()) == [n.encode() * 100 for n in names]
    spent = accounting.snapshot() - before
    assert 1 <= spent.hedges <= 0.05 * len(names) + 2
    assert spent.by_op.get("get") == len(names) + spent.hedges
    # A hedge is counted when its task starts; one cancelled while it was still
    # connecting (its read answered meanwhile) never reaches the server. With
    # the re-armed timers of a spent budget a hedge may start just as its stall
    # ends, so the server sees from none to all of them (docs/reliability.md).
    assert len(names) <= _server_gets(emulator) <= len(names) + spent.hedges


def test_a_stall_behind_a_spent_budget_is_hedged_once_the_budget_refills(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    # Two reads stall together and the budget holds one hedge: the second
    # read's timer finds it spent. Later reads refill the budget, and the
    # stalled read, still waiting, is hedged then (before, it never was, and
    # waited out its stall).
    config = HedgeConfig(budget=0.5, burst=1.0, initial_wait=0.2, floor=0.2, min_samples=4)
    store = gcs_bucket_factory(emulator, prefix="refill", retry=ONE_ATTEMPT, hedge=config)
    objects = {"a": b"a" * 5000, "b": b"b" * 5000, "z": b"z" * 5000}
    emulator.seed(store.bucket, objects.items())
    for _ in range(4):  # the reads of this size the wait is learnt from; the budget fills
        assert runtime.run(store.get("z")) == objects["z"]
    for name in ("a", "b"):
        emulator.add_fault("get", "stall", match=name, stall_seconds=60.0)

    async def later_reads() -> None:
        await asyncio.sleep(0.5)  # both stalled reads' timers (0.2 s) have fired
        for _ in range(2):
            assert await store.get("z") == objects["z"]

    async def scenario() -> list[bytes]:
        reads = asyncio.gather(store.get("a"), store.get("b"), later_reads())
        got = await asyncio.wait_for(reads, timeout=30.0)  # the stalls last 60 s
        return [got[0], got[1]]

    before = accounting.snapshot()
    assert runtime.run(scenario()) == [objects["a"], objects["b"]]
    spent = accounting.snapshot() - before
    assert spent.hedges == 2
    assert spent.retries == 0


def test_a_map_batch_hedges_its_last_straggler_before_the_reads_own_wait(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    # A map-style batch (plain sampler: __getitems__) waits for its slowest
    # read. Each read's own wait here is 30 s (its size class never learnt);
    # once the other 15 have answered, the one left is hedged after twice
    # their median instead, so the batch ends well before its 60 s stall.
    config = HedgeConfig(initial_wait=30.0, floor=0.05, min_samples=512, budget=1.0)
    store = gcs_bucket_factory(emulator, prefix="batch", retry=ONE_ATTEMPT, hedge=config)
    objects = {f"s/{i:02d}": bytes([i]) * 3000 for i in range(16)}
    emulator.seed(store.bucket, objects.items())
    ds = BucketMapDataset.from_prefix(
        f"gs://{store.bucket}/s/",
        gcs=GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=ONE_ATTEMPT, hedge=config),
        compose=ComposeConfig(enabled=False),
    )
    emulator.add_fault("get", "stall", match="s/07", stall_seconds=60.0)
    before = accounting.snapshot()
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(ds.__getitems__(list(range(16)))))
    reader.start()
    reader.join(timeout=20.0)  # before the read's own 30 s wait, and its 60 s stall
    assert not reader.is_alive(), "the batch waited for its stalled read"
    assert got == list(objects.values())
    spent = accounting.snapshot() - before
    assert spent.hedges == 1
    assert spent.retries == 0


@pytest.mark.parametrize("stalled", [32, 5], ids=["first-of-a-chunk", "inside-the-first-chunk"])
@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_a_prefetch_window_hedges_the_read_it_waits_for_once_later_ones_overtake_it(
    emulator: Any, gcs_bucket_factory: Any, kind: str, stalled: int, monkeypatch: Any
) -> None:
    # Objects read one by one through the ordered window (the iterable, and
    # the map-style dataset with BucketBatchSampler): the consumer takes them
    # in order, so a stalled read holds everything behind it. Its own wait is
    # 30 s here (its size class never learnt); once enough later objects have
    # arrived while the consumer waits for it, it is hedged at once, and the
    # epoch ends well before its 60 s stall. (All 96 reads begin together, so
    # on a zonal bucket, whose streams answer in no set order, another read
    # the consumer waits for may be overtaken as much and hedged too.)
    # The consumer waits for a chunk at a time (the iterable's 32 objects, the
    # map-style batch's 8), and for the first from the window's start: a
    # stalled read inside one holds it as much as one at its start, and is
    # hedged the same way. The consumer's periodic look for a vanished parent
    # (every PARENT_CHECK_S) would also find the chunk's first objects and go
    # on to wait for the stalled one: set past the test's bound, it hides
    # nothing here.
    monkeypatch.setattr(runtime, "PARENT_CHECK_S", 60.0)
    config = HedgeConfig(initial_wait=30.0, floor=0.05, min_samples=512, budget=1.0)
    store = gcs_bucket_factory(emulator, prefix="window", retry=ONE_ATTEMPT, hedge=config)
    objects = {f"w/{i:02d}": bytes([i]) * 3000 for i in range(96)}
    emulator.seed(store.bucket, objects.items())
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=ONE_ATTEMPT, hedge=config)
    off = ComposeConfig(enabled=False)
    uri = f"gs://{store.bucket}/w/"
    loader: Any
    if kind == "map":
        ds = BucketMapDataset.from_prefix(uri, gcs=gcs, compose=off)
        loader = DataLoader(ds, batch_sampler=BucketBatchSampler(ds, batch_size=8, shuffle=False))
    else:
        loader = DataLoader(
            BucketIterableDataset.from_prefix(uri, gcs=gcs, compose=off), batch_size=8
        )
    emulator.add_fault("get", "stall", match=f"w/{stalled:02d}", stall_seconds=60.0)
    before = accounting.snapshot()
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(x for b in loader for x in b))
    reader.start()
    reader.join(timeout=20.0)  # before the read's own 30 s wait, and its 60 s stall
    assert not reader.is_alive(), "the window waited for its stalled read"
    assert got == list(objects.values())
    spent = accounting.snapshot() - before
    assert 1 <= spent.hedges <= config.burst
    assert spent.retries == 0


@pytest.mark.parametrize("hedge", [False, True], ids=["hedging-off", "hedging-on"])
def test_a_stall_longer_than_read_timeout_is_retried_then_an_error_naming_the_uri(
    emulator: Any, gcs_bucket_factory: Any, hedge: bool
) -> None:
    retry = RetryConfig(
        initial_backoff=0.01, max_backoff=0.02, read_timeout=0.5, max_attempts=2, deadline=30.0
    )
    config = EAGER if hedge else HedgeConfig(enabled=False)
    store = gcs_bucket_factory(emulator, prefix="stall", retry=retry, hedge=config)
    runtime.run(store.put("obj", b"x" * 1000))
    # Every read of the object stalls (a hedge included) for longer than read_timeout.
    emulator.add_fault("get", "stall", match="obj", count=None, stall_seconds=3.0)
    before = accounting.snapshot()
    with pytest.raises(DeadlineExceededError) as info:
        runtime.run(store.get("obj"))
    spent = accounting.snapshot() - before
    assert f"gs://{store.bucket}/obj" in str(info.value)
    assert "read timeout" in str(info.value)
    assert spent.retries == 1
    assert spent.by_op.get("get") == 2 + spent.hedges
