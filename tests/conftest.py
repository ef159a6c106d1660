"""Shared fixtures: the local GCS emulator and stores pointed at it.

- ``emulator``: the model store, no latency, one per session; in the modules
  ``tests/bucket_kinds.py`` lists, each test runs twice, ``bucket_kind``
  ``regional`` (that emulator, over HTTP) and ``zonal`` (a session-wide emulator
  serving gRPC too, whose ``create_bucket`` makes zonal buckets, with
  ``$TORCHBUCKET_GCS_GRPC_ENDPOINT`` set so every store and child process
  finds the gRPC endpoint).
- ``fake_gcs``: a session-wide emulator on the fake-gcs-server binary.
- ``gcs_bucket_factory``: ``make(emu, **config) -> GCSStore`` on a fresh bucket.

After every test, fault rules are cleared on every emulator started here, and
latency or an rps cap a test set through the :class:`Emulator` API is reset, so
nothing leaks from one test into the next.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

import bucket_kinds
from bucket_kinds import ZonalBuckets
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator

# Short backoff and deadline: a test that injects faults retries in
# milliseconds and a broken one fails in seconds, not minutes.
EMULATOR_RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)

# Property tests: CI (``$CI`` set, as .ci/run and most CI services do) draws
# the same examples every run and gives an example no deadline, so a clean
# clone's run fails on a change, never on the day's draw or a slow example on
# a loaded VM; local runs draw anew each time and keep what fails in
# .hypothesis/ (how human_bytes' "1e+03 MiB" was found).
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

_started: list[Emulator] = []


def _start(backend: str, *, grpc: bool = False) -> Emulator:
    emu = Emulator(backend=backend, grpc=grpc)  # type: ignore[arg-type]
    emu.start()
    _started.append(emu)
    return emu


@pytest.fixture(scope="session")
def regional_emulator() -> Iterator[Emulator]:
    """The model store behind the front server, no latency, for the whole session."""
    emu = _start("model")
    yield emu
    _started.remove(emu)
    emu.stop()


@pytest.fixture(scope="session")
def grpc_emulator() -> Iterator[Emulator]:
    """The model store serving the JSON, XML and gRPC APIs, for the whole session."""
    pytest.importorskip("grpc")
    emu = _start("model", grpc=True)
    yield emu
    _started.remove(emu)
    emu.stop()


@pytest.fixture
def bucket_kind() -> str:
    """``"regional"``, except where ``pytest_generate_tests`` parametrizes it."""
    return "regional"


@pytest.fixture
def emulator(bucket_kind: str, request: pytest.FixtureRequest) -> Emulator:
    """The emulator a test's buckets are made on: regional, or zonal over gRPC.

    ``zonal``: the gRPC emulator seen through :class:`bucket_kinds.ZonalBuckets`
    (its ``create_bucket`` makes zonal buckets), and the gRPC endpoint in
    ``$TORCHBUCKET_GCS_GRPC_ENDPOINT`` for the test, which every ``GCSConfig``
    (``transport="auto"``) and every child process reads.
    """
    if bucket_kind == "regional":
        return request.getfixturevalue("regional_emulator")  # type: ignore[no-any-return]
    emu: Emulator = request.getfixturevalue("grpc_emulator")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("TORCHBUCKET_GCS_GRPC_ENDPOINT", f"http://{emu.grpc_endpoint}")
    return ZonalBuckets(emu)  # type: ignore[return-value]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Both bucket kinds for the tests of the modules ``bucket_kinds.py`` lists."""
    kinds = bucket_kinds.kinds_for(metafunc.definition.nodeid, metafunc.fixturenames)
    if kinds is not None:
        metafunc.parametrize("bucket_kind", kinds)


def pytest_report_header() -> str:
    """How many modules run on both bucket kinds, and which tests do not, named."""
    return bucket_kinds.header()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[Emulator]:
    """fake-gcs-server behind the front server, for the whole session."""
    emu = _start("fake-gcs")
    yield emu
    _started.remove(emu)
    emu.stop()


@pytest.fixture(autouse=True)
def _reset_emulators() -> Iterator[None]:
    """Clear faults (and restore latency and rps cap) after each test."""
    yield
    for emu in list(_started):
        if not emu.running:
            continue
        if emu.faults_active:
            emu.clear_faults()
        if emu.latency is not None:
            emu.set_latency(None)
        if emu.rps_cap is not None:
            emu.set_rps_cap(None)


@pytest.fixture
def gcs_bucket_factory() -> Iterator[Callable[..., Any]]:
    """A factory of ``GCSStore``s, each on a new, empty bucket of an emulator.

    ``make(emu, *, prefix="t", retry=EMULATOR_RETRY, **config)`` creates bucket
    ``{prefix}-{random}`` on ``emu`` and returns a store for it; extra keyword
    arguments go to ``GCSConfig``. Stores are closed after the test.
    """
    from torchbucket import runtime

    stores: list[Any] = []

    def make(
        emu: Emulator, *, prefix: str = "t", retry: RetryConfig | None = None, **config: Any
    ) -> Any:
        from torchbucket.storage.gcs import GCSConfig, GCSStore

        name = f"{prefix}-{uuid.uuid4().hex[:16]}"
        emu.create_bucket(name)
        store = GCSStore(
            name,
            config=GCSConfig(
                endpoint=emu.endpoint, anonymous=True, retry=retry or EMULATOR_RETRY, **config
            ),
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        close = getattr(store, "close", None)
        if close is not None:
            runtime.run(close())


@pytest.fixture
def bucket_name() -> str:
    """A fresh, valid bucket name (not created)."""
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def run_child_script(
    emulator: Emulator, tmp_path: Any
) -> Callable[[str], subprocess.CompletedProcess[str]]:
    """``run(source)``: run ``source`` in a fresh Python process against the emulator.

    The script gets ``gs://<a new bucket>/shared.bin`` as its one argument and
    ``STORAGE_EMULATOR_HOST`` in its environment; the caller checks the result.
    """

    def run(source: str) -> subprocess.CompletedProcess[str]:
        bucket = f"child-{uuid.uuid4().hex[:12]}"
        emulator.create_bucket(bucket)
        script = tmp_path / f"{bucket}.py"
        script.write_text(source)
        return subprocess.run(
            [sys.executable, str(script), f"gs://{bucket}/shared.bin"],
            env={**os.environ, "STORAGE_EMULATOR_HOST": emulator.endpoint},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


class Reply:
    """One HTTP answer: ``status``, ``headers`` (case-insensitive), ``body``."""

    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        import json

        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:200]!r})"


def http_call(
    endpoint: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """One request on a fresh connection; any status is returned, not raised."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


@pytest.fixture
def raw_http() -> Callable[..., Reply]:
    """``raw_http(emu, method, path, body=None, headers=None) -> Reply``: plain HTTP."""

    def call(emu: Emulator, method: str, path: str, body: bytes | None = None, **kw: Any) -> Reply:
        return http_call(emu.endpoint, method, path, body, **kw)

    return call


@pytest.fixture
def torchbucket_gs() -> Iterator[None]:
    """fsspec's ``gs://`` and ``gcs://`` served by torchbucket for one test.

    The test environment has gcsfs (the emulator is tested with it), which
    ``torchbucket.lightning`` leaves in charge by default; tests of Lightning
    against the emulator take ``gs://`` over as a user would, with
    ``register_filesystem(force=True)``, and the registry is put back after.
    """
    import importlib

    from torchbucket.lightning import register_filesystem

    # fsspec's package exports a read-only view named ``registry`` that hides
    # the module of that name.
    _fsspec_registry = importlib.import_module("fsspec.registry")
    saved = dict(_fsspec_registry._registry)
    assert register_filesystem(force=True)
    yield
    _fsspec_registry._registry.clear()
    _fsspec_registry._registry.update(saved)
