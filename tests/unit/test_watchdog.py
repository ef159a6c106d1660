"""The per-loop watchdog: limits that cut tasks short, and cancellations that are not its own."""

from __future__ import annotations

import asyncio

import pytest

from torchbucket.runtime import watchdog


async def _watched(timeout: float | None, quiet: float | None = None) -> str:
    dog = watchdog.watchdog()
    watch = dog.start(timeout, quiet=quiet)
    try:
        await asyncio.sleep(5)
        return "finished"
    except asyncio.CancelledError:
        if dog.stop(watch):
            return "cut short"
        raise
    finally:
        dog.stop(watch)


def test_a_deadline_cuts_the_task_short() -> None:
    assert asyncio.run(_watched(0.05)) == "cut short"


def test_a_silence_limit_without_progress_cuts_the_task_short() -> None:
    assert asyncio.run(_watched(None, quiet=0.05)) == "cut short"


def test_many_watches_each_end_at_their_own_deadline() -> None:
    async def main() -> list[str]:
        return await asyncio.gather(*(_watched(0.02 * (i + 1)) for i in range(20)))

    assert asyncio.run(main()) == ["cut short"] * 20


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def main() -> None:
        task = asyncio.ensure_future(_watched(10.0))
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_a_finished_watch_leaves_the_task_alone() -> None:
    async def main() -> str:
        dog = watchdog.watchdog()
        watch = dog.start(0.02)
        dog.stop(watch)
        await asyncio.sleep(0.05)  # past the deadline: no cancellation arrives
        return "slept"

    assert asyncio.run(main()) == "slept"
