"""Fault injection: each kind fires on the nth matching request only."""

from __future__ import annotations

import base64
import http.client
import uuid
from collections.abc import Callable
from typing import Any

import google_crc32c
import pytest

from torchbucket.emulator import Emulator
from torchbucket.errors import ConfigError

pytestmark = pytest.mark.emulator

Http = Callable[..., Any]
DATA = bytes(range(256)) * 8


@pytest.fixture(params=["model", "fake-gcs"])
def emu(request: pytest.FixtureRequest) -> Emulator:
    return request.getfixturevalue(  # type: ignore[no-any-return]
        "emulator" if request.param == "model" else "fake_gcs"
    )


@pytest.fixture
def bucket(emu: Emulator) -> str:
    name = f"f-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    emu.seed(name, {"obj": DATA})
    return name


def _get(raw_http: Http, emu: Emulator, bucket: str, timeout: float = 10.0) -> Any:
    return raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o/obj?alt=media", timeout=timeout)


def _outcome(raw_http: Http, emu: Emulator, bucket: str) -> str:
    """What a client sees: 'ok', a status, 'corrupt' or the failure's kind."""
    try:
        reply = _get(raw_http, emu, bucket, timeout=1.0)
    except http.client.IncompleteRead:
        return "truncate"
    except TimeoutError:
        return "stall"
    except (ConnectionError, http.client.RemoteDisconnected):
        return "reset"
    if reply.status != 200:
        return str(reply.status)
    crc = base64.b64encode(google_crc32c.value(reply.body).to_bytes(4, "big")).decode()
    if reply.body != DATA:
        assert len(reply.body) == len(DATA)
        assert f"crc32c={crc}" not in reply.headers["x-goog-hash"]  # headers still honest
        return "corrupt"
    return "ok"


@pytest.mark.parametrize(
    "kind",
    [
        *["403", "404", "405", "408", "429", "500", "501", "502", "503", "504"],
        *["reset", "truncate", "corrupt", "stall"],
    ],
)
def test_each_fault_kind_fires_on_the_nth_request_only(
    emu: Emulator, bucket: str, raw_http: Http, kind: str
) -> None:
    emu.add_fault("get", kind, nth=2, stall_seconds=3.0)
    assert [_outcome(raw_http, emu, bucket) for _ in range(3)] == ["ok", kind, "ok"]
    stats = emu.stats()
    assert stats["faults"][kind] >= 1


def test_count_match_and_any_operation(emu: Emulator, bucket: str, raw_http: Http) -> None:
    emu.seed(bucket, {"other": b"o"})
    emu.add_fault("*", "503", count=None, match="obj")
    assert raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o/other?alt=media").status == 200
    assert [_get(raw_http, emu, bucket).status for _ in range(3)] == [503, 503, 503]
    assert raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o/obj").status == 503  # metadata too
    emu.clear_faults()
    assert _get(raw_http, emu, bucket).status == 200
    emu.add_fault("get", "429", nth=2, count=2)
    assert [_get(raw_http, emu, bucket).status for _ in range(4)] == [200, 429, 429, 200]


def test_a_reset_write_leaves_the_bucket_unchanged(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    emu.add_fault("put", "reset")
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        raw_http(emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=new", b"x")
    assert emu.object_names(bucket) == ["obj"]
    ok = raw_http(emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=new", b"x")
    assert ok.status == 200
    assert emu.object_names(bucket) == ["new", "obj"]


def test_faults_on_list_and_xml_multipart(emu: Emulator, bucket: str, raw_http: Http) -> None:
    emu.add_fault("list", "503")
    assert raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o").status == 503
    assert raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o").status == 200
    emu.add_fault("mpu_initiate", "403")
    refused = raw_http(emu, "POST", f"/{bucket}/k?uploads")
    assert refused.status == 403
    assert b"<Code>AccessDenied</Code>" in refused.body  # XML API errors in XML


def test_bad_rules_are_refused(emulator: Emulator) -> None:
    with pytest.raises(ConfigError):
        emulator.add_fault("get", "teapot")
    with pytest.raises(ConfigError):
        emulator.add_fault("fetch", "503")
    with pytest.raises(ConfigError):
        emulator.add_fault("get", "503", nth=0)
