"""Contender: a bare aiohttp loop, the limit (no retries, no checksums, no limiter).

``concurrency`` coroutines share one iterator of names and one session whose
connector allows as many connections; each GETs ``alt=media`` and reads the
body. With ``warmup`` > 0, that many objects are fetched first, outside the
phase, on the same loop and session (imports, the session and its connections
are then set up, as in a long-running job). The phase covers every fetch and
(``verify: "inline"``) the byte check of each body as it arrives; with
``verify: "after"`` bodies are kept and checked after the phase. Without
warm-up the session's creation is inside the phase.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``
(or ``sizes``: name -> size, the objects to read, of many sizes),
``concurrency``, ``verify`` (``"inline"`` or ``"after"``), ``warmup`` (0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
from _common import Phase, Verifier, emit, load_spec, object_url, spec_objects


async def fetch(
    session: aiohttp.ClientSession,
    urls: Iterator[tuple[str, str]],
    concurrency: int,
    verifier: Verifier | None,
    kept: dict[str, bytes],
) -> None:
    """GET every URL with ``concurrency`` coroutines; check or keep each body."""

    async def worker() -> None:
        for name, url in urls:
            async with session.get(url) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"GET {name}: HTTP {resp.status}")
            if verifier is not None:
                verifier.check(body, name)
            else:
                kept[name] = body

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def main() -> None:
    spec = load_spec()
    names, verifier = spec_objects(spec)
    concurrency = int(spec["concurrency"])
    inline = spec.get("verify", "inline") == "inline"
    warmup = min(int(spec.get("warmup", 0)), len(names))
    kept: dict[str, bytes] = {}
    endpoint, bucket = spec["endpoint"], spec["bucket"]

    def urls(subset: list[str]) -> Iterator[tuple[str, str]]:
        return iter([(n, object_url(endpoint, bucket, n)) for n in subset])

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
        return aiohttp.ClientSession(connector=connector)

    async def warm_then_measure() -> Phase:
        async with session() as s:
            await fetch(s, urls(names[:warmup]), concurrency, None, {})
            with Phase(endpoint) as phase:
                await fetch(s, urls(names), concurrency, verifier if inline else None, kept)
        return phase

    async def measure_all() -> None:
        async with session() as s:
            await fetch(s, urls(names), concurrency, verifier if inline else None, kept)

    if warmup:
        phase = asyncio.run(warm_then_measure())
    else:
        with Phase(endpoint) as phase:
            asyncio.run(measure_all())
    for name, body in kept.items():
        verifier.check(body, name)
    emit({**phase.result(), "objects": verifier.finish(), "bytes": verifier.bytes})


if __name__ == "__main__":
    main()
