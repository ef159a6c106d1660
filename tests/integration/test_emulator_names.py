"""The emulator refuses the object names GCS refuses, on both stores, on every write.

GCS's rules (https://cloud.google.com/storage/docs/objects#naming): 1-1,024
bytes of UTF-8, no carriage return or line feed, not ``.`` or ``..``, not under
``.well-known/acme-challenge/``. A refused write answers 400 with reason
``invalid`` and leaves nothing behind; a name of exactly 1,024 bytes is fine.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from torchbucket.emulator import Emulator
from torchbucket.errors import ConfigError

pytestmark = pytest.mark.emulator

Http = Callable[..., Any]

BAD_NAMES = {
    "1025 bytes": "n/" + "x" * 1023,
    "1026 bytes of UTF-8 in 514 characters": "é" * 513,
    "line feed": "a\nb",
    "carriage return": "a\rb",
    "NUL": "a\x00b",
    "dot": ".",
    "dot dot": "..",
    "acme challenge": ".well-known/acme-challenge/token",
}
LONGEST = "n/" + "y" * 1022  # 1,024 bytes: allowed


@pytest.fixture(params=["model", "fake-gcs"])
def emu(request: pytest.FixtureRequest) -> Emulator:
    return request.getfixturevalue(  # type: ignore[no-any-return]
        "emulator" if request.param == "model" else "fake_gcs"
    )


@pytest.fixture
def bucket(emu: Emulator) -> str:
    name = f"n-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    emu.seed(name, {"src": b"source"})
    return name


def _media(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    query = urlencode({"uploadType": "media", "name": name})
    return http(emu, "POST", f"/upload/storage/v1/b/{bucket}/o?{query}", b"data")


def _multipart(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    meta = json.dumps({"name": name})
    body = (
        f"--B\r\nContent-Type: application/json\r\n\r\n{meta}\r\n"
        "--B\r\nContent-Type: text/plain\r\n\r\ndata\r\n--B--\r\n"
    ).encode()
    headers = {"Content-Type": "multipart/related; boundary=B"}
    path = f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
    return http(emu, "POST", path, body, headers=headers)


def _resumable(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    body = json.dumps({"name": name}).encode()
    path = f"/upload/storage/v1/b/{bucket}/o?uploadType=resumable"
    return http(emu, "POST", path, body, headers={"Content-Type": "application/json"})


def _xml_put(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    return http(emu, "PUT", f"/{bucket}/{quote(name)}", b"data")


def _xml_initiate(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    return http(emu, "POST", f"/{bucket}/{quote(name)}?uploads")


def _compose(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    body = json.dumps({"sourceObjects": [{"name": "src"}]}).encode()
    path = f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}/compose"
    return http(emu, "POST", path, body, headers={"Content-Type": "application/json"})


def _rewrite(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    path = f"/storage/v1/b/{bucket}/o/src/rewriteTo/b/{bucket}/o/{quote(name, safe='')}"
    return http(emu, "POST", path, b"")


def _copy(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    path = f"/storage/v1/b/{bucket}/o/src/copyTo/b/{bucket}/o/{quote(name, safe='')}"
    return http(emu, "POST", path, b"")


def _move(http: Http, emu: Emulator, bucket: str, name: str) -> Any:
    path = f"/storage/v1/b/{bucket}/o/src/moveTo/o/{quote(name, safe='')}"
    return http(emu, "POST", path, b"")


WRITES = {
    "media upload": _media,
    "multipart upload": _multipart,
    "resumable upload": _resumable,
    "XML PUT": _xml_put,
    "XML multipart initiate": _xml_initiate,
    "compose": _compose,
    "rewrite": _rewrite,
    "copy": _copy,
    "move": _move,
}


@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
def test_every_write_refuses_a_name_gcs_refuses(
    emu: Emulator, bucket: str, raw_http: Http, write: Callable[..., Any]
) -> None:
    for why, name in BAD_NAMES.items():
        reply = write(raw_http, emu, bucket, name)
        assert reply.status == 400, (why, reply)
        if b"<Error>" not in reply.body:  # the XML API answers XML
            assert reply.json()["error"]["errors"][0]["reason"] == "invalid", why
    assert emu.object_names(bucket) == ["src"]


@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
def test_a_name_of_exactly_1024_bytes_is_written(
    emu: Emulator, bucket: str, raw_http: Http, write: Callable[..., Any]
) -> None:
    reply = write(raw_http, emu, bucket, LONGEST)
    assert reply.status == 200, reply


def test_seeding_refuses_a_name_gcs_refuses(emu: Emulator, bucket: str) -> None:
    for name in BAD_NAMES.values():
        with pytest.raises(ConfigError, match="object name"):
            emu.seed(bucket, {"fine": b"x", name: b"y"})
    assert emu.object_names(bucket) == ["src"]
