"""Contender: torchbucket's ``GCSStore.get`` on the runtime's background loop.

The same driver as ``aiohttp_loop.py`` (``concurrency`` coroutines sharing one
iterator of names), run through ``runtime.run`` on torchbucket's loop, each
coroutine awaiting ``store.get(name)``: retries, the adaptive limiter, CRC32C
verification and error mapping included. The store is made inside the phase
(its session opens on the first request), as the bare loop's session is.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``concurrency``, ``verify`` (``"inline"`` or ``"after"``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from _common import Phase, Verifier, emit, generated_names, load_spec

from torchbucket import runtime
from torchbucket.config import ConcurrencyConfig
from torchbucket.storage.gcs import GCSConfig, GCSStore


async def fetch_all(spec: dict[str, Any], verifier: Verifier) -> dict[str, bytes]:
    concurrency = int(spec["concurrency"])
    config = GCSConfig(
        endpoint=spec["endpoint"],
        concurrency=ConcurrencyConfig(initial=max(concurrency, 4), maximum=max(concurrency, 512)),
    )
    store = GCSStore(spec["bucket"], config=config)
    names = iter(generated_names(spec["prefix"], spec["count"]))
    inline = spec.get("verify", "inline") == "inline"
    kept: dict[str, bytes] = {}

    async def worker() -> None:
        for name in names:
            body = await store.get(name)
            if inline:
                verifier.check(body, name)
            else:
                kept[name] = body

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await store.close()
    return kept


def main() -> None:
    spec = load_spec()
    names = generated_names(spec["prefix"], spec["count"])
    verifier = Verifier(names, spec["size"], spec.get("seed", 0))
    with Phase(spec["endpoint"]) as phase:
        kept = runtime.run(fetch_all(spec, verifier))
    for name, body in kept.items():
        verifier.check(body, name)
    emit({**phase.result(), "objects": verifier.finish(), "bytes": verifier.bytes})


if __name__ == "__main__":
    main()
