"""A new process's hedger (a DataLoader worker's, every epoch) can hedge its first reads.

A read whose size class has no history yet waits ``initial_wait``, plus its
length at 25 MB/s from 1 MiB on; the budget starts with ``burst`` hedges
saved up. Before, a read of 1 MiB or more was never hedged until 32 of its
class had answered, and no read until 20 had been made, so a stall among a
worker's first reads held its first batch for the whole stall.
"""

from __future__ import annotations

import asyncio

import pytest

from torchbucket.config import HedgeConfig
from torchbucket.storage.gcs._hedge import Hedger

MIB = 1 << 20


async def _stalled() -> str:
    await asyncio.sleep(30.0)
    return "first"


async def _prompt() -> str:
    return "spare"


def _race(hedger: Hedger, nbytes: int | None) -> str:
    async def read() -> str:
        return await hedger.run(_stalled, _prompt, lambda s: s, nbytes)

    async def bounded() -> str:
        return await asyncio.wait_for(read(), timeout=5.0)

    return asyncio.run(bounded())


@pytest.mark.parametrize("nbytes", [None, 64 << 10, MIB, 8 * MIB], ids=str)
def test_the_first_read_of_a_new_hedger_is_hedged_when_it_stalls(nbytes: int | None) -> None:
    hedger = Hedger(HedgeConfig())
    assert _race(hedger, nbytes) == "spare"
    assert hedger.hedges == 1


def test_a_read_longer_than_max_read_size_is_still_never_hedged() -> None:
    hedger = Hedger(HedgeConfig(max_read_size=4 * MIB))
    with pytest.raises(TimeoutError):
        _race(hedger, 8 * MIB)
    assert hedger.hedges == 0


def test_the_first_hedges_are_bounded_by_the_burst() -> None:
    hedger = Hedger(HedgeConfig(burst=2.0, budget=0.0))

    async def many() -> list[str]:
        async def one() -> str:
            return await hedger.run(_stalled, _prompt, lambda s: s, 64 << 10)

        tasks = [asyncio.ensure_future(one()) for _ in range(5)]
        await asyncio.sleep(1.0)  # past every read's wait of 0.2 s
        for task in tasks:
            task.cancel()  # the hedged ones are done: a no-op for them
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return [r for r in done if isinstance(r, str)]

    assert asyncio.run(many()) == ["spare", "spare"]
    assert hedger.hedges == 2
