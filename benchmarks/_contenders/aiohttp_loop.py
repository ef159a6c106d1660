"""Contender: a bare aiohttp loop, the limit (no retries, no checksums, no limiter).

``concurrency`` coroutines share one iterator of names and one session whose
connector allows as many connections; each GETs ``alt=media`` and reads the
body. The measured phase covers the session's creation, every fetch, and
(``verify: "inline"``) the byte check of each body as it arrives; with
``verify: "after"`` bodies are kept and checked after the phase.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``concurrency``, ``verify`` (``"inline"`` or ``"after"``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from _common import Phase, Verifier, emit, generated_names, load_spec, object_url


async def fetch_all(spec: dict[str, Any], verifier: Verifier) -> dict[str, bytes]:
    names = generated_names(spec["prefix"], spec["count"])
    urls = iter([(n, object_url(spec["endpoint"], spec["bucket"], n)) for n in names])
    inline = spec.get("verify", "inline") == "inline"
    kept: dict[str, bytes] = {}
    concurrency = int(spec["concurrency"])
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for name, url in urls:
                async with session.get(url) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"GET {name}: HTTP {resp.status}")
                if inline:
                    verifier.check(body, name)
                else:
                    kept[name] = body

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return kept


def main() -> None:
    spec = load_spec()
    names = generated_names(spec["prefix"], spec["count"])
    verifier = Verifier(names, spec["size"], spec.get("seed", 0))
    with Phase(spec["endpoint"]) as phase:
        kept = asyncio.run(fetch_all(spec, verifier))
    for name, body in kept.items():
        verifier.check(body, name)
    emit({**phase.result(), "objects": verifier.finish(), "bytes": verifier.bytes})


if __name__ == "__main__":
    main()
