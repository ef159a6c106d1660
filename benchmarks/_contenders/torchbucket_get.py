"""Contender: torchbucket's ``GCSStore.get`` on the runtime's background loop.

The same driver as ``aiohttp_loop.py`` (``concurrency`` coroutines sharing one
iterator of names), run through ``runtime.run`` on torchbucket's loop, each
coroutine awaiting ``store.get(name)``: retries, the adaptive limiter, CRC32C
verification and error mapping included. With ``warmup`` > 0 that many
objects are fetched first through the same store, outside the phase (the
loop, the session and its connections are then up, as in a long-running job);
without, the store is made inside the phase.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``concurrency``, ``verify`` (``"inline"`` or ``"after"``), ``warmup`` (0),
``accounting`` (default true; false replaces request counting with no-ops, to
measure what counting costs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from _common import Phase, Verifier, emit, load_spec, spec_objects

from torchbucket import runtime
from torchbucket.config import ConcurrencyConfig
from torchbucket.runtime import accounting  # the module the stores call: patched below
from torchbucket.storage.gcs import GCSConfig, GCSStore


async def fetch(
    store: GCSStore,
    names: Iterator[str],
    concurrency: int,
    verifier: Verifier | None,
    kept: dict[str, bytes],
) -> None:
    """``store.get`` every name with ``concurrency`` coroutines; check or keep each body."""

    async def worker() -> None:
        for name in names:
            body = await store.get(name)
            if verifier is not None:
                verifier.check(body, name)
            else:
                kept[name] = body

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _no_accounting() -> None:
    """Replace the counters the stores call with no-ops (this process only)."""

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    for name in ("count", "received", "retried", "throttle"):
        setattr(accounting, name, nothing)
    accounting.classify = lambda method, path, query: "get"  # type: ignore[assignment]


def main() -> None:
    spec = load_spec()
    if not spec.get("accounting", True):
        _no_accounting()
    names, verifier = spec_objects(spec)
    concurrency = int(spec["concurrency"])
    inline = spec.get("verify", "inline") == "inline"
    warmup = min(int(spec.get("warmup", 0)), len(names))
    kept: dict[str, bytes] = {}
    config = GCSConfig(
        endpoint=spec["endpoint"],
        concurrency=ConcurrencyConfig(
            initial_in_flight=max(concurrency, 4), max_in_flight=max(concurrency, 512)
        ),
    )
    check = verifier if inline else None

    async def measure_all() -> None:
        store = GCSStore(spec["bucket"], config=config)
        try:
            await fetch(store, iter(names), concurrency, check, kept)
        finally:
            await store.close()

    if warmup:
        store = GCSStore(spec["bucket"], config=config)
        runtime.run(fetch(store, iter(names[:warmup]), concurrency, None, {}))
        with Phase(spec["endpoint"]) as phase:
            runtime.run(fetch(store, iter(names), concurrency, check, kept))
        runtime.run(store.close())
    else:
        with Phase(spec["endpoint"]) as phase:
            runtime.run(measure_all())
    for name, body in kept.items():
        verifier.check(body, name)
    emit({**phase.result(), "objects": verifier.finish(), "bytes": verifier.bytes})


if __name__ == "__main__":
    main()
