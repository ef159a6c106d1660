"""The emulator's "auth required" mode: bearer tokens it issued, checked per request.

With :class:`AuthState` attached, the front server answers every GCS request
without a valid, unexpired bearer token with 401, the way GCS does
(https://cloud.google.com/storage/docs/json_api/v1/status-codes: the JSON API's
``{"error": {"code": 401, ...}}``, reason ``required`` ("Login Required") for a
request without credentials and ``authError`` ("Invalid Credentials") for a
token that is unknown, expired or revoked, with a ``WWW-Authenticate: Bearer
realm="https://accounts.google.com/"`` challenge that adds
``error="invalid_token"`` for the latter (RFC 6750 section 3); the XML API's
``<Error><Code>AuthenticationRequired</Code>...``). A token without a Cloud
Storage scope gets 403, as on GCS. A resumable upload's session URI authorises
its chunks by itself, so a chunk may come without a token; one that comes with
a token has it checked ("any request with an Authorization header, even if
empty, is validated": https://cloud.google.com/storage/docs/troubleshooting).

Tokens come from the token service (:mod:`torchbucket.emulator._token_service`):
an OAuth2 token endpoint for service-account keys and a GCE metadata server.
Each lives ``token_lifetime`` seconds. The admin API under ``/_emulator/auth/``
registers keys, revokes a key (with every token it granted), expires every
token at once, and reports counters: token requests per client process,
refused grants, and refused requests by cause.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from torchbucket.emulator._http import (
    ApiError,
    Route,
    api_error_response,
    error_response,
    json_response,
)
from torchbucket.emulator._sa_keys import KeyInfo, load_public_key

__all__ = ["READ_OPS", "AuthState", "Token"]

_REALM = 'Bearer realm="https://accounts.google.com/"'
_STORAGE_SCOPES = frozenset(
    {
        "https://www.googleapis.com/auth/devstorage.read_write",
        "https://www.googleapis.com/auth/devstorage.full_control",
        "https://www.googleapis.com/auth/cloud-platform",
    }
)
_READ_ONLY_SCOPES = frozenset(
    {
        "https://www.googleapis.com/auth/devstorage.read_only",
        "https://www.googleapis.com/auth/cloud-platform.read-only",
    }
)
#: Operations a read-only scope allows.
READ_OPS = frozenset({"get", "head", "list", "iam", "bucket_get", "mpu_list", "mpu_parts"})
# Expired tokens are forgotten (then refused as unknown) past this many.
_MAX_TOKENS = 100_000


@dataclass(slots=True)
class Token:
    """One issued access token."""

    expires_at: float  # time.monotonic()
    scopes: frozenset[str]
    key_id: str | None  # None: from the metadata server
    client: str  # the requesting process, for the counters
    revoked: bool = False


class AuthState:
    """Keys, issued tokens and counters of one emulator.

    Args:
        token_lifetime: Seconds each token is valid (a whole number, >= 1).
    """

    def __init__(self, *, token_lifetime: int) -> None:
        if token_lifetime < 1:
            raise ValueError(f"token_lifetime must be >= 1 second, got {token_lifetime}")
        self.token_lifetime = token_lifetime
        self.keys: dict[str, KeyInfo] = {}
        self.tokens: dict[str, Token] = {}
        self.token_port = 0
        self.reset_counters()

    def reset_counters(self) -> None:
        """Zero the counters."""
        self.token_requests: Counter[str] = Counter()
        self.metadata_requests = 0
        self.grants_refused: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.accepted = 0

    # ---------------------------------------------------------------- tokens

    def issue(self, scopes: frozenset[str], key_id: str | None, client: str) -> str:
        """A new token for ``scopes`` (counted as one token request of ``client``)."""
        if len(self.tokens) >= _MAX_TOKENS:
            now = time.monotonic()
            self.tokens = {k: t for k, t in self.tokens.items() if t.expires_at > now}
        token = "ya29.emu." + secrets.token_urlsafe(32)
        self.tokens[token] = Token(time.monotonic() + self.token_lifetime, scopes, key_id, client)
        return token

    def remaining(self, token: str) -> float:
        """Seconds ``token`` has left (<= 0 when expired, revoked or unknown)."""
        record = self.tokens.get(token)
        if record is None or record.revoked:
            return 0.0
        return record.expires_at - time.monotonic()

    def revoke_key(self, key_id: str) -> int:
        """Revoke a key and every token it granted; return how many tokens."""
        key = self.keys.get(key_id)
        if key is None:
            raise ApiError(404, f"no service-account key {key_id!r}")
        key.revoked = True
        count = 0
        for record in self.tokens.values():
            if record.key_id == key_id and not record.revoked:
                record.revoked = True
                count += 1
        return count

    def expire_all(self) -> int:
        """Expire every token now; return how many were still valid."""
        now = time.monotonic()
        count = 0
        for record in self.tokens.values():
            if record.expires_at > now:
                record.expires_at = now
                count += 1
        return count

    # ---------------------------------------------------------------- requests

    def check(self, headers: Mapping[str, str], route: Route) -> web.Response | None:
        """``None`` if the request is authorised, else the answer GCS would give."""
        value = headers.get("Authorization")
        if value is None:
            if route.kind == "resumable_chunk":
                return None  # the session URI is the credential
            return self._refuse("missing", route.xml)
        scheme, _, token = value.strip().partition(" ")
        record = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if record is None:
            return self._refuse("unknown", route.xml)
        key = self.keys.get(record.key_id) if record.key_id is not None else None
        if record.revoked or (key is not None and key.revoked):
            return self._refuse("revoked", route.xml)
        if time.monotonic() >= record.expires_at:
            return self._refuse("expired", route.xml)
        scopes = record.scopes
        if scopes.isdisjoint(_STORAGE_SCOPES) and (
            route.op not in READ_OPS or scopes.isdisjoint(_READ_ONLY_SCOPES)
        ):
            self.rejected["scope"] += 1
            return error_response(
                403,
                "Insufficient Permission",
                xml=route.xml,
                reason="insufficientPermissions",
                headers={"WWW-Authenticate": f'{_REALM}, error="insufficient_scope"'},
            )
        self.accepted += 1
        return None

    def _refuse(self, cause: str, xml: bool) -> web.Response:
        self.rejected[cause] += 1
        if cause == "missing":
            message, reason, challenge = "Login Required", "required", _REALM
        else:
            message, reason = "Invalid Credentials", "authError"
            challenge = f'{_REALM}, error="invalid_token"'
        if xml:
            message = "Authentication required."
        return error_response(
            401,
            message,
            xml=xml,
            reason=reason,
            xml_code="AuthenticationRequired",
            headers={"WWW-Authenticate": challenge},
        )

    # ---------------------------------------------------------------- admin

    def snapshot(self) -> dict[str, Any]:
        """The counters, as ``Emulator.auth_stats`` returns them."""
        return {
            "token_lifetime": self.token_lifetime,
            "token_requests": dict(self.token_requests),
            "metadata_requests": self.metadata_requests,
            "grants_refused": dict(self.grants_refused),
            "rejected": dict(self.rejected),
            "accepted": self.accepted,
            "keys": {k: {"email": v.email, "revoked": v.revoked} for k, v in self.keys.items()},
        }

    async def admin(self, request: web.BaseRequest, path: str) -> web.Response:
        """Answer one ``/_emulator/auth/...`` request (``path`` after that prefix)."""
        try:
            return await self._admin(request, path.strip("/"))
        except ApiError as exc:
            return api_error_response(exc)

    async def _admin(self, request: web.BaseRequest, path: str) -> web.Response:
        method = request.method
        if path == "stats":
            if method == "DELETE":
                self.reset_counters()
            return _ok(self.snapshot())
        if path == "keys" and method == "POST":
            try:
                body = json.loads(await request.read())
                key_id, email = str(body["key_id"]), str(body["email"])
                public_key = load_public_key(str(body["public_key_pem"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, f"a key needs key_id, email and public_key_pem: {exc}") from exc
            self.keys[key_id] = KeyInfo(key_id, email, public_key)
            return _ok({"key_id": key_id})
        if path.startswith("keys/") and path.endswith("/revoke") and method == "POST":
            count = self.revoke_key(path[5 : -len("/revoke")])
            return _ok({"tokens_revoked": count})
        if path == "tokens/expire" and method == "POST":
            return _ok({"tokens_expired": self.expire_all()})
        raise ApiError(404, f"no admin endpoint {method} /_emulator/auth/{path}")


def _ok(payload: Any) -> web.Response:
    return json_response(json.dumps(payload).encode())
