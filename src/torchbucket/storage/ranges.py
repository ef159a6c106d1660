"""Parallel ranged reads of objects into caller's buffers.

One object (or several) split into ranges that are read concurrently, each
straight into its slice of one preallocated buffer (``ObjectStore.get_into``),
so a large object arrives at the speed of many streams instead of one, with no
copy to join the pieces. Checkpoint loads, DCP loads and the datasets' large
samples use it. Byte ranges wanted apart (a DCP load's items, a batch of packed
samples) are merged into fewer reads by :func:`merge_ranges`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence

from torchbucket.errors import ConfigError, IntegrityError
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage.base import ObjectStore

__all__ = ["fetch_ranges", "merge_ranges", "split_ranges"]


def split_ranges(size: int, chunk: int) -> list[tuple[int, int]]:
    """Cut ``[0, size)`` into consecutive half-open ranges of at most ``chunk`` bytes.

    Raises:
        ConfigError: ``chunk`` (a configured range size) is below 1.
    """
    if chunk < 1:
        raise ConfigError(f"split_ranges: chunk must be >= 1, got {chunk}")
    return [(start, min(start + chunk, size)) for start in range(0, size, chunk)]


def merge_ranges(ranges: Iterable[tuple[int, int]], max_gap: int = 0) -> list[tuple[int, int]]:
    """Merge half-open ``[start, end)`` ranges that overlap or lie close together.

    Two ranges are merged when the gap between them is at most ``max_gap``
    bytes: fetching a few unneeded bytes costs less than another request.

    Args:
        ranges: The ranges, in any order; empty ranges are dropped.
        max_gap: The largest gap, in bytes, that is read through. Default 0:
            only touching or overlapping ranges are merged.

    Returns:
        Sorted, disjoint ranges covering every input range, with gaps larger
        than ``max_gap`` between them.

    Raises:
        ConfigError: ``max_gap`` is negative (a ``ValueError``).
        ValueError: A range ends before it starts.
    """
    if max_gap < 0:
        raise ConfigError(f"merge_ranges: max_gap must be >= 0, got {max_gap}")
    ordered = sorted(ranges)
    merged: list[tuple[int, int]] = []
    for start, end in ordered:
        if end < start:
            raise ValueError(f"range end {end} is before start {start}")
        if end == start:
            continue
        if merged and start <= merged[-1][1] + max_gap:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


async def fetch_ranges(
    store: ObjectStore,
    jobs: Sequence[tuple[str, memoryview, int]],
    *,
    generation: int | None = None,
    chunk_size: int,
    parallelism: int,
    on_job_done: Callable[[int], None] | None = None,
    admit: Callable[[int], Awaitable[None]] | None = None,
    operation: str = "checkpoint load",
) -> None:
    """Fill each ``(key, buffer, start)`` job's buffer from ``key`` at ``start``.

    Buffers larger than ``chunk_size`` are split into ranges; at most
    ``parallelism`` ranges are in flight across all jobs, started in job order.
    ``on_job_done(index)`` (called on the loop) says when a job's buffer is full,
    so a caller can use it while later jobs still download. ``await
    admit(index)``, if given, comes before each of a job's ranges starts: a
    caller that frees buffers as it uses them bounds the bytes held that way.
    ``operation`` names the caller's operation in errors.

    Raises:
        NotFoundError: An object is gone, or (with ``generation``) was rewritten.
        IntegrityError: A range came back short.
    """
    semaphore = asyncio.Semaphore(parallelism)
    ranges = [split_ranges(len(buffer), chunk_size) for _, buffer, _ in jobs]
    left = [len(r) for r in ranges]

    async def one(index: int, key: str, view: memoryview, start: int) -> None:
        if admit is not None:
            await admit(index)
        async with semaphore:
            got = await store.get_into(key, view, start=start, generation=generation)
        if got != len(view):
            raise IntegrityError(
                f"range {start}-{start + len(view)} returned {got} bytes, expected {len(view)}",
                operation=operation,
                uri=store.uri(key),
            )
        left[index] -= 1
        if not left[index] and on_job_done is not None:
            on_job_done(index)

    tasks = [
        asyncio.ensure_future(one(index, key, buffer[lo:hi], start + lo))
        for index, (key, buffer, start) in enumerate(jobs)
        for lo, hi in ranges[index]
    ]
    if on_job_done is not None:
        for index, count in enumerate(left):
            if not count:  # an empty buffer is full already
                on_job_done(index)
    # After a failure (or a cancellation), the other ranges stop before the
    # caller frees or reuses the buffers.
    await gather_or_cancel(tasks)
