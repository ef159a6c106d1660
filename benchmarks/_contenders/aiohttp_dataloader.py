"""Contender: a minimal asyncio prototype inside a DataLoader (a reference, not a product).

An ``IterableDataset`` whose every worker runs its own event loop in its own
thread of control: ``__next__`` drives the loop until at least one body is
ready and takes every ready one, so the loop makes progress only while the
worker is asked for samples (no background thread, no lock, no GIL hand-off).
``prefetch`` coroutines per worker share the worker's shard (names
``worker::num_workers``) and put bodies on a bounded queue; samples arrive in
completion order. No retries, no checksum, no error mapping: what the
DataLoader architecture allows with this many requests in flight.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``prefetch`` (per worker), ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from typing import Any

import aiohttp
from _common import (
    load_spec,
    measure_loader,
    object_url,
    spec_objects,
)
from torch.utils.data import IterableDataset, get_worker_info


class PrototypeDataset(IterableDataset[tuple[str, bytes]]):
    """``(name, body)`` samples fetched by ``prefetch`` coroutines per worker."""

    def __init__(self, endpoint: str, bucket: str, names: list[str], prefetch: int) -> None:
        self.endpoint, self.bucket, self.names, self.prefetch = endpoint, bucket, names, prefetch

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        shard = self.names[worker::workers]
        loop = asyncio.new_event_loop()
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(maxsize=self.prefetch)
        pending = iter(shard)

        async def fetcher(session: aiohttp.ClientSession) -> None:
            for name in pending:
                async with session.get(object_url(self.endpoint, self.bucket, name)) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"GET {name}: HTTP {resp.status}")
                await queue.put((name, body))

        async def start() -> tuple[aiohttp.ClientSession, asyncio.Future[Any]]:
            connector = aiohttp.TCPConnector(limit=self.prefetch, limit_per_host=self.prefetch)
            session = aiohttp.ClientSession(connector=connector)
            tasks = asyncio.gather(*(fetcher(session) for _ in range(self.prefetch)))
            return session, tasks

        async def ready(tasks: asyncio.Future[Any]) -> list[tuple[str, bytes]]:
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, tasks}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():  # a fetcher failed: raise its error
                get.cancel()
                tasks.result()
            items = [get.result()]
            while not queue.empty():
                items.append(queue.get_nowait())
            return items

        session, tasks = loop.run_until_complete(start())
        buffered: collections.deque[tuple[str, bytes]] = collections.deque()
        try:
            for _ in range(len(shard)):
                if not buffered:
                    buffered.extend(loop.run_until_complete(ready(tasks)))
                yield buffered.popleft()
            loop.run_until_complete(tasks)
        finally:
            loop.run_until_complete(session.close())
            loop.close()


def main() -> None:
    spec = load_spec()
    names, verifier = spec_objects(spec)
    dataset = PrototypeDataset(spec["endpoint"], spec["bucket"], names, int(spec["prefetch"]))
    measure_loader(spec, dataset, verifier, names_known=True)


if __name__ == "__main__":
    main()
