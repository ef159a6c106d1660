"""One store fixture, parametrised over every backend the conformance suite holds equal.

``memory`` and ``local`` need nothing; ``gcs-model`` and ``gcs-fake`` talk HTTP to
the emulator's front server (fixtures ``emulator`` and ``fake_gcs`` in
tests/conftest.py) with a fresh bucket per test; ``gcs-model-https`` talks HTTPS
to a model-store emulator with a CA of its own, trusted the way users trust one
(``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``), so the TLS paths of the aiohttp
session and of the in-place ranged reader run in every ``make test``. Tests drive the async store
through :class:`SyncStore`, which runs each call on torchbucket's background loop.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.storage import (
    RemoteStore,
    SupportsBucketInfo,
    SupportsBuckets,
    SupportsCreationTime,
    SupportsFolders,
    SupportsSoftDelete,
    SupportsZonal,
    UncheckedMultipartAssembly,
)
from torchbucket.storage.base import ObjectStore
from torchbucket.storage.local import LocalStore
from torchbucket.storage.memory import MemoryStore, delete_memory_bucket

BACKENDS = [
    "memory",
    "local",
    pytest.param("gcs-model", marks=pytest.mark.emulator),
    pytest.param("gcs-fake", marks=pytest.mark.emulator),
    pytest.param("gcs-model-https", marks=pytest.mark.emulator),
]
GCS_BACKENDS = [
    pytest.param("gcs-model", marks=pytest.mark.emulator),
    pytest.param("gcs-fake", marks=pytest.mark.emulator),
]
#: The optional protocols (``storage.capabilities``) each backend claims, exactly.
GCS_CLAIMS: set[type] = {
    SupportsBuckets,
    SupportsFolders,
    SupportsBucketInfo,
    SupportsSoftDelete,
    SupportsCreationTime,
    UncheckedMultipartAssembly,
    RemoteStore,
    SupportsZonal,
}
CLAIMS: dict[str, set[type]] = {
    "memory": {SupportsBuckets, SupportsFolders},
    "local": {SupportsBuckets},
    "gcs-model": GCS_CLAIMS,
    "gcs-fake": GCS_CLAIMS,
    "gcs-model-https": GCS_CLAIMS,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``capability(P)`` exists only for the backends that claim ``P``.

    Not collected rather than skipped: a backend without the feature has
    nothing to run, and ``test_backend_claims_exactly_its_protocols`` checks
    that it does not claim it.
    """
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("capability")
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend") if callspec is not None else None
        if marker is not None and backend is not None and marker.args[0] not in CLAIMS[backend]:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# Short backoff so that a fault test's retries cost milliseconds.
FAST_RETRY = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=20.0, read_timeout=10.0)


class SyncStore:
    """A store seen through ``runtime.run``, with keys relative to a root.

    Every method of the store is available with the same arguments; keys given
    to it are prefixed with ``root`` (an empty string on a bucket, the test's
    temporary directory on the local filesystem). ``stream`` returns the list of
    chunks. Names in results are left as the store reports them; :meth:`rel`
    strips the root.
    """

    def __init__(self, store: ObjectStore, root: str, backend: str, emulator: Any = None) -> None:
        self.store = store
        self.root = root
        self.backend = backend
        self.emulator = emulator

    def k(self, name: str) -> str:
        """The full key of ``name``."""
        return self.root + name

    def rel(self, key: str) -> str:
        """``key`` without the root."""
        assert key.startswith(self.root), key
        return key[len(self.root) :]

    def uri(self, name: str = "") -> str:
        return self.store.uri(self.k(name))

    def run(self, coro: Any) -> Any:
        return runtime.run(coro)

    def put(self, name: str, data: bytes, **kw: Any) -> Any:
        return self.run(self.store.put(self.k(name), data, **kw))

    def get(self, name: str, **kw: Any) -> bytes:
        return self.run(self.store.get(self.k(name), **kw))  # type: ignore[no-any-return]

    def head(self, name: str) -> Any:
        return self.run(self.store.head(self.k(name)))

    def delete(self, name: str, **kw: Any) -> None:
        self.run(self.store.delete(self.k(name), **kw))

    def copy(self, source: str, destination: str, **kw: Any) -> Any:
        return self.run(self.store.copy(self.k(source), self.k(destination), **kw))

    def compose(self, destination: str, sources: list[Any], **kw: Any) -> Any:
        return self.run(self.store.compose(self.k(destination), sources, **kw))

    def get_into(self, name: str, buffer: memoryview, **kw: Any) -> int:
        return self.run(self.store.get_into(self.k(name), buffer, **kw))  # type: ignore[no-any-return]

    def stream(self, name: str, **kw: Any) -> list[bytes]:
        async def collect() -> list[bytes]:
            return [chunk async for chunk in self.store.stream(self.k(name), **kw)]

        return self.run(collect())  # type: ignore[no-any-return]

    def put_stream(self, name: str, chunks: AsyncIterator[bytes], **kw: Any) -> Any:
        return self.run(self.store.put_stream(self.k(name), chunks, **kw))

    def list_page(self, prefix: str = "", **kw: Any) -> Any:
        for offset in ("start_offset", "end_offset"):
            if kw.get(offset) is not None:
                kw[offset] = self.k(kw[offset])
        if kw.get("page_token") is not None:
            kw["page_token"] = kw["page_token"]
        return self.run(self.store.list_page(self.k(prefix), **kw))

    def list_all(self, prefix: str = "", page_size: int = 1000, **kw: Any) -> list[str]:
        """Every name under ``prefix`` (relative), following page tokens."""
        names: list[str] = []
        token = None
        while True:
            page = self.list_page(prefix, page_size=page_size, page_token=token, **kw)
            assert len(page.objects) <= page_size
            names.extend(self.rel(o.name) for o in page.objects)
            token = page.next_page_token
            if token is None:
                return names

    def mpu(self, method: str, name: str, *args: Any, **kw: Any) -> Any:
        return self.run(getattr(self.store, f"multipart_{method}")(self.k(name), *args, **kw))

    def multipart_list(self, prefix: str = "") -> Any:
        return self.run(self.store.multipart_list(self.k(prefix)))


@pytest.fixture(scope="session")
def emulator_https() -> Iterator[Emulator]:
    """The model store behind the front server over HTTPS, for the whole session."""
    with Emulator(backend="model", tls=True) as emu:
        yield emu


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def s(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SyncStore]:
    """A fresh, empty namespace on ``backend``."""
    if backend == "memory":
        name = f"conf-{uuid.uuid4().hex[:16]}"
        yield SyncStore(MemoryStore(name), "", backend)
        delete_memory_bucket(name)
    elif backend == "local":
        yield SyncStore(LocalStore(), str(tmp_path).lstrip("/") + "/", backend)
    elif backend == "gcs-model-https":
        emulator = request.getfixturevalue("emulator_https")
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("SSL_CERT_FILE", emulator.ca_file)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", emulator.ca_file)
        make = request.getfixturevalue("gcs_bucket_factory")
        yield SyncStore(make(emulator, prefix="conf"), "", backend, emulator)
    else:
        emulator = request.getfixturevalue("emulator" if backend == "gcs-model" else "fake_gcs")
        make = request.getfixturevalue("gcs_bucket_factory")
        yield SyncStore(make(emulator, prefix="conf"), "", backend, emulator)
