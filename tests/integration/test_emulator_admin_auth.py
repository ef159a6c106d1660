"""In "auth required" mode the emulator's admin API needs its admin secret.

GCS requests there answer 401 without a token, so seeding, listing, fault
injection and key registration under ``/_emulator/`` must not be open either:
each needs the secret made at start (``Emulator.admin_token``, sent by the
handle itself) in the ``x-emulator-admin-token`` header; 401 without it, 403
with another. Without auth mode the admin API stays open.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from conftest import http_call
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

HEADER = "x-emulator-admin-token"
JSON = {"Content-Type": "application/json"}

# (method, path, body): seeding, listing, fault injection, key registration, counters.
ADMIN_CALLS = [
    ("POST", "/_emulator/seed/bkt", json.dumps({"objects": {"planted": "eA=="}}).encode()),
    ("GET", "/_emulator/objects/bkt", None),
    ("POST", "/_emulator/faults", json.dumps({"op": "get", "kind": "503"}).encode()),
    ("DELETE", "/_emulator/faults", None),
    ("POST", "/_emulator/buckets", json.dumps({"name": "planted-bucket"}).encode()),
    ("GET", "/_emulator/stats", None),
    ("POST", "/_emulator/auth/keys", b'{"key_id": "k", "email": "e", "public_key_pem": "x"}'),
    ("POST", "/_emulator/auth/tokens/expire", b"{}"),
    ("POST", "/_emulator/shutdown", b"{}"),
]
IDS = [f"{method} {path}" for method, path, _ in ADMIN_CALLS]


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(auth=True) as emu:
        emu.create_bucket("bkt")
        emu.seed("bkt", {"a": b"hello"})
        yield emu


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS, ids=IDS)
def test_an_admin_call_without_the_secret_is_refused(
    emu: Emulator, method: str, path: str, body: bytes | None
) -> None:
    missing = http_call(emu.endpoint, method, path, body, headers=JSON)
    assert missing.status == 401, missing
    assert missing.json()["error"]["errors"][0]["reason"] == "required"
    wrong = http_call(emu.endpoint, method, path, body, headers={**JSON, HEADER: "guess"})
    assert wrong.status == 403, wrong
    # Nothing was done: no object planted, no fault added, the server still up.
    assert emu.running
    assert emu.object_names("bkt") == ["a"]
    assert emu.faults() == []
    assert "k" not in emu.auth_stats()["keys"]


def test_an_admin_call_with_the_secret_works(emu: Emulator) -> None:
    assert emu.admin_token
    headers = {**JSON, HEADER: emu.admin_token}
    data = base64.b64encode(b"seeded").decode()
    body = json.dumps({"objects": {"by-hand": data}}).encode()
    reply = http_call(emu.endpoint, "POST", "/_emulator/seed/bkt", body, headers=headers)
    assert reply.status == 200, reply
    listed = http_call(emu.endpoint, "GET", "/_emulator/objects/bkt", headers=headers)
    assert listed.json()["names"] == ["a", "by-hand"]
    # The handle sends the secret itself.
    emu.add_fault("get", "503", count=1)
    assert len(emu.faults()) == 1
    emu.clear_faults()


def test_without_auth_mode_the_admin_api_is_open(emulator: Emulator) -> None:
    assert emulator.admin_token is None
    reply = http_call(emulator.endpoint, "GET", "/_emulator/faults")
    assert reply.status == 200, reply
