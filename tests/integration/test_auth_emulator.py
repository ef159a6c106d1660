"""The emulator's "auth required" mode and token service, over plain HTTP.

What GCS answers without a valid token (401 with its JSON or XML error and a
``WWW-Authenticate`` challenge), what Google's token endpoint answers a bad
grant, and the metadata server's ``Metadata-Flavor`` rules.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import http_call
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

_REALM = 'Bearer realm="https://accounts.google.com/"'
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(auth=True, token_lifetime=3600) as emu:
        emu.create_bucket("bkt")
        emu.seed("bkt", {"a": b"hello"})
        yield emu


def _token_host(emu: Emulator) -> str:
    return f"http://{emu.metadata_host}"


def _metadata_token(emu: Emulator, scopes: str = _SCOPE) -> str:
    query = urllib.parse.urlencode({"scopes": scopes})
    reply = http_call(
        _token_host(emu),
        "GET",
        f"/computeMetadata/v1/instance/service-accounts/default/token?{query}",
        headers={"Metadata-Flavor": "Google"},
    )
    assert reply.status == 200, reply
    return str(reply.json()["access_token"])


def test_a_request_without_a_token_gets_login_required(emu: Emulator) -> None:
    reply = http_call(emu.endpoint, "GET", "/storage/v1/b/bkt/o/a?alt=media")
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == _REALM
    error = reply.json()["error"]
    assert (error["code"], error["message"]) == (401, "Login Required")
    assert error["errors"][0]["reason"] == "required"


@pytest.mark.parametrize("token", ["not-a-token", "ya29.emu.unknown"])
def test_an_unknown_token_gets_invalid_credentials(emu: Emulator, token: str) -> None:
    reply = http_call(
        emu.endpoint, "GET", "/storage/v1/b/bkt/o/a", headers={"Authorization": f"Bearer {token}"}
    )
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == f'{_REALM}, error="invalid_token"'
    assert reply.json()["error"]["errors"][0]["reason"] == "authError"


def test_the_xml_api_answers_xml(emu: Emulator) -> None:
    reply = http_call(emu.endpoint, "GET", "/bkt/a", headers={"Authorization": "Bearer nope"})
    assert reply.status == 401
    assert b"<Code>AuthenticationRequired</Code>" in reply.body


def test_a_valid_token_reads_and_an_expired_one_is_refused(emu: Emulator) -> None:
    token = _metadata_token(emu)
    auth = {"Authorization": f"Bearer {token}"}
    reply = http_call(emu.endpoint, "GET", "/storage/v1/b/bkt/o/a?alt=media", headers=auth)
    assert (reply.status, reply.body) == (200, b"hello")
    emu.reset_auth_stats()
    assert emu.expire_tokens() >= 1
    reply = http_call(emu.endpoint, "GET", "/storage/v1/b/bkt/o/a?alt=media", headers=auth)
    assert reply.status == 401
    assert emu.auth_stats()["rejected"] == {"expired": 1}


def test_a_token_without_a_storage_scope_is_forbidden(emu: Emulator) -> None:
    token = _metadata_token(emu, scopes="https://www.googleapis.com/auth/userinfo.email")
    reply = http_call(
        emu.endpoint, "GET", "/storage/v1/b/bkt/o/a", headers={"Authorization": f"Bearer {token}"}
    )
    assert reply.status == 403
    assert reply.json()["error"]["errors"][0]["reason"] == "insufficientPermissions"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 403),
        ({"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.1"}, 403),
        ({"Metadata-Flavor": "Google"}, 200),
    ],
)
def test_the_metadata_server_wants_its_flavor_header(
    emu: Emulator, headers: dict[str, str], status: int
) -> None:
    reply = http_call(_token_host(emu), "GET", "/", headers=headers)
    assert reply.status == status
    assert reply.headers["Metadata-Flavor"] == "Google"


def _grant(emu: Emulator, form: dict[str, str]) -> Any:
    reply = http_call(
        _token_host(emu),
        "POST",
        "/token",
        body=urllib.parse.urlencode(form).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    return reply.status, json.loads(reply.body)


def test_the_token_endpoint_refuses_what_google_refuses(emu: Emulator, tmp_path: Path) -> None:
    import google.auth.crypt
    import google.auth.jwt

    key = emu.service_account_key(tmp_path / "key.json")
    info = json.loads((tmp_path / "key.json").read_text())
    signer = google.auth.crypt.RSASigner.from_service_account_info(info)
    now = 1_000_000_000  # far in the past: outside any reasonable timeframe
    stale = google.auth.jwt.encode(
        signer,
        {
            "iss": key["client_email"],
            "aud": "https://oauth2.googleapis.com/token",
            "scope": _SCOPE,
            "iat": now,
            "exp": now + 3600,
        },
    ).decode()
    grant = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    status, answer = _grant(emu, {"grant_type": grant, "assertion": stale})
    assert status == 400
    assert answer["error"] == "invalid_grant"
    assert "iat and exp" in answer["error_description"]
    status, answer = _grant(emu, {"grant_type": "password", "assertion": stale})
    assert (status, answer["error"]) == (400, "unsupported_grant_type")
    status, answer = _grant(emu, {"grant_type": grant, "assertion": stale[:-8] + "AAAAAAAA"})
    assert (status, answer["error"]) == (400, "invalid_grant")
