"""Contender: ``google-cloud-storage`` with a thread pool (runs in ``.venv-bench``).

``concurrency`` threads each call ``bucket.blob(name).download_as_bytes()``
(the library's defaults: its retry policy and MD5 check). The client is made
before the phase with anonymous credentials against ``STORAGE_EMULATOR_HOST``;
its HTTP connection pool is widened to ``concurrency`` so no thread reopens
connections (the default pool keeps 10, which only makes it slower).

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``concurrency``, ``verify`` (``"inline"`` or ``"after"``), ``warmup`` (0: objects
fetched first, outside the phase, through the same client and pool).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from _common import Phase, emit, load_spec, spec_objects
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from requests.adapters import HTTPAdapter


def make_client(endpoint: str, pool: int) -> storage.Client:
    """A client on the emulator with a connection pool of ``pool``."""
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool)
    client._http.mount("http://", adapter)
    client._http.mount("https://", adapter)
    return client


def main() -> None:
    spec = load_spec()
    concurrency = int(spec["concurrency"])
    names, verifier = spec_objects(spec)
    client = make_client(spec["endpoint"], concurrency)
    bucket = client.bucket(spec["bucket"])
    inline = spec.get("verify", "inline") == "inline"
    lock = threading.Lock()
    kept: dict[str, bytes] = {}

    def fetch(name: str) -> None:
        body = bucket.blob(name).download_as_bytes()
        if inline:
            with lock:
                verifier.check(body, name)
        else:
            kept[name] = body

    warmup = min(int(spec.get("warmup", 0)), len(names))
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(bucket.blob(n).download_as_bytes) for n in names[:warmup]]:
            future.result()
        with Phase(spec["endpoint"]) as phase:
            for future in [pool.submit(fetch, n) for n in names]:
                future.result()
    for name, body in kept.items():
        verifier.check(body, name)
    emit({**phase.result(), "objects": verifier.finish(), "bytes": verifier.bytes})


if __name__ == "__main__":
    main()
