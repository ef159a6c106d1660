"""Which connection failures are a local endpoint that is not there (fail fast)."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from torchbucket.errors import TransientError, UnreachableError
from torchbucket.storage.gcs import GCSConfig
from torchbucket.storage.gcs._errors import is_local_endpoint, unreachable_error
from torchbucket.storage.gcs._transport import GCSTransport


def refused(host: str, port: int) -> aiohttp.ClientConnectorError:
    key = ConnectionKey(host, port, False, True, None, None, None)
    return aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("http://127.0.0.1:9023", True),
        ("http://localhost:4443", True),
        ("http://[::1]:80", True),
        ("https://storage.googleapis.com", False),
        ("http://gcs.internal:4443", False),
    ],
)
def test_local_endpoints(endpoint: str, local: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert is_local_endpoint(endpoint) is local


def test_the_emulator_host_is_local_wherever_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "gcs.internal:4443")
    assert is_local_endpoint("http://gcs.internal:4443")


def test_a_refused_connection_to_google_stays_a_transient_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    transport = GCSTransport("b", GCSConfig(endpoint="https://storage.googleapis.com"))
    error = transport.transport_error(refused("storage.googleapis.com", 443), "get", "gs://b/x")
    assert type(error) is TransientError


def test_a_refused_connection_to_the_emulator_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9")
    transport = GCSTransport("b", GCSConfig())
    error = transport.transport_error(refused("127.0.0.1", 9), "get", "gs://b/x")
    assert isinstance(error, UnreachableError)
    assert str(error) == (
        "get gs://b/x: cannot connect to http://127.0.0.1:9: connection refused; "
        "is the emulator running? (STORAGE_EMULATOR_HOST=127.0.0.1:9)"
    )


def test_a_name_that_does_not_resolve_is_said_so() -> None:
    error = unreachable_error(
        socket.gaierror(-2, "Name or service not known"),
        "http://localhost:1",
        operation="list",
        uri="gs://b/",
    )
    assert error is not None
    assert "host name does not resolve" in error.message


def test_a_reset_is_not_unreachable() -> None:
    assert (
        unreachable_error(
            ConnectionResetError(104, "reset"),
            "http://127.0.0.1:1",
            operation="get",
            uri="gs://b/x",
        )
        is None
    )
