"""A local aiohttp server for one test: every request to ``handle``, on a free port.

The unit tests that script GCS's answers (retries, resumed streams) all start
the same server on torchbucket's background loop::

    with local_server(scripted.handle) as endpoint:
        store = GCSStore("bkt", config=GCSConfig(endpoint=endpoint))

A module of its own, not ``conftest.py``, for the reason ``memory_helper`` gives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web

from torchbucket import runtime

__all__ = ["local_server"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.contextmanager
def local_server(handle: Handler, *, client_max_size: int = 1 << 20) -> Iterator[str]:
    """Serve every method and path with ``handle``; yield the endpoint ``http://127.0.0.1:<port>``."""

    async def start() -> web.AppRunner:
        app = web.Application(client_max_size=client_max_size)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = runtime.run(start())
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        runtime.run(runner.cleanup())
