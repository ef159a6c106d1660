"""``runtime.tasks``: every result, or no task left running (gather_or_cancel, cancel_and_wait)."""

from __future__ import annotations

import asyncio

import pytest

from torchbucket.runtime.tasks import cancel_and_wait, gather_or_cancel


async def _value(value: int, delay: float = 0.0) -> int:
    await asyncio.sleep(delay)
    return value


def test_results_come_in_the_order_given() -> None:
    async def main() -> list[int]:
        return await gather_or_cancel(_value(i, 0.01 * (3 - i)) for i in range(4))

    assert asyncio.run(main()) == [0, 1, 2, 3]
    assert asyncio.run(gather_or_cancel([])) == []  # type: ignore[arg-type]


def test_a_failure_stops_the_others_before_it_is_raised() -> None:
    stopped: list[str] = []

    async def slow(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)  # a clean-up that itself awaits
            stopped.append(name)

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("boom")

    async def main() -> None:
        with pytest.raises(ValueError, match="boom"):
            await gather_or_cancel([slow("a"), fails(), slow("b")])
        # Both have run their clean-up by the time the error reaches the caller.
        assert sorted(stopped) == ["a", "b"]

    asyncio.run(main())


def test_cancelling_the_caller_stops_every_task() -> None:
    stopped: list[int] = []

    async def slow(i: int) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.append(i)

    async def main() -> None:
        outer = asyncio.ensure_future(gather_or_cancel(slow(i) for i in range(3)))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert sorted(stopped) == [0, 1, 2]

    asyncio.run(main())


def test_cancel_and_wait_stops_every_task_and_drops_their_errors() -> None:
    stopped: list[int] = []

    async def slow(i: int) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)
            stopped.append(i)

    async def fails() -> None:
        raise ValueError("already failed")

    async def main() -> None:
        tasks = [asyncio.ensure_future(slow(i)) for i in range(3)]
        tasks.append(asyncio.ensure_future(fails()))
        done = asyncio.ensure_future(_value(7))
        await asyncio.sleep(0.01)
        await cancel_and_wait([*tasks, done])
        assert sorted(stopped) == [0, 1, 2]
        assert all(t.done() for t in tasks) and done.result() == 7
        await cancel_and_wait([])  # nothing to wait for

    asyncio.run(main())
