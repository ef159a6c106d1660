"""A plain-HTTP endpoint (an emulator) never builds a TLS context.

Loading the system's CAs costs 50-100 ms of CPU: a one-page listing in a fresh
process paid it in full before its first request (0.15 s against 0.07 s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.config import ConcurrencyConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import _session

pytestmark = pytest.mark.emulator


def test_a_plain_http_store_never_builds_a_tls_context(
    emulator: Emulator,
    gcs_bucket_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a TLS context was built for a plain-HTTP endpoint")

    monkeypatch.setattr(_session, "ssl_context", refuse)
    # A session key used nowhere else (a ceiling of 7), so that no session made
    # before this test is reused.
    store = gcs_bucket_factory(
        emulator,
        concurrency=ConcurrencyConfig(min_in_flight=1, initial_in_flight=7, max_in_flight=7),
    )
    runtime.run(store.put("k", b"payload"))
    assert runtime.run(store.get("k")) == b"payload"
    assert [o.name for o in runtime.run(store.list_page("")).objects] == ["k"]
