"""Service-account keys for the emulator's token service: make one, check a JWT.

:func:`new_key_file` plays the part of IAM's "create key": it generates an RSA
key pair with ``cryptography`` and returns the JSON key file that
``google-auth`` loads from ``GOOGLE_APPLICATION_CREDENTIALS`` (its ``token_uri``
pointing at the emulator), and the public half the token service keeps.
:func:`verify_assertion` is what Google's token endpoint does with the JWT such
a key signs (RFC 7523, https://www.rfc-editor.org/rfc/rfc7523#section-3): an
RS256 signature by a known, unrevoked key whose account is the issuer, an
audience of Google's token endpoint, and ``iat``/``exp`` no more than an hour
apart around now.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["GOOGLE_TOKEN_AUDIENCES", "GrantError", "KeyInfo", "new_key_file", "verify_assertion"]

#: Audiences google-auth signs for (``service_account._GOOGLE_OAUTH2_TOKEN_ENDPOINT``
#: whatever the key file's ``token_uri``), and the older one.
GOOGLE_TOKEN_AUDIENCES = (
    "https://oauth2.googleapis.com/token",
    "https://accounts.google.com/o/oauth2/token",
)
_MAX_ASSERTION_LIFETIME = 3600
_CLOCK_SKEW = 300
# Google's own wording of these errors (the description of invalid_grant).
BAD_SIGNATURE = "Invalid JWT Signature."
BAD_TIMEFRAME = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
    "timeframe. Check your iat and exp values in the JWT claim."
)


class GrantError(Exception):
    """A refused grant: the OAuth ``error`` code and its description."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(f"{error}: {description}")
        self.error = error
        self.description = description


@dataclass(slots=True)
class KeyInfo:
    """A registered public key of a service account."""

    key_id: str
    email: str
    public_key: Any  # cryptography RSAPublicKey
    revoked: bool = False


def new_key_file(
    *, token_uri: str, email: str, project: str = "emulator-project"
) -> tuple[dict[str, str], str]:
    """A fresh service-account key file and the PEM of its public key.

    Args:
        token_uri: Where google-auth asks for tokens (the emulator's token service).
        email: The service account's ``client_email``.
        project: The key file's ``project_id``.

    Returns:
        ``(key file as a dict, public key PEM)``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    key_file = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": private_pem,
        "client_email": email,
        "client_id": str(secrets.randbits(64)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
    }
    return key_file, public_pem


def load_public_key(pem: str) -> Any:
    """An RSA public key from its PEM text.

    Raises:
        ValueError: Not an RSA public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = serialization.load_pem_public_key(pem.encode())
    if not isinstance(key, rsa.RSAPublicKey):
        raise ValueError("not an RSA public key")
    return key


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verify_assertion(
    assertion: str, keys: dict[str, KeyInfo], now: float | None = None
) -> tuple[str, dict[str, Any]]:
    """Check a JWT-bearer grant's assertion; return the signing key's id and the claims.

    Raises:
        GrantError: ``invalid_grant`` with Google's description, for a malformed
            JWT, an unknown, revoked or mismatched key, a bad signature, a wrong
            audience or a time outside the assertion's window.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    try:
        header_b64, payload_b64, signature_b64 = assertion.split(".")
        header = json.loads(_b64decode(header_b64))
        claims = json.loads(_b64decode(payload_b64))
        signature = _b64decode(signature_b64)
    except (ValueError, TypeError) as exc:
        raise GrantError("invalid_grant", "Invalid JWT: malformed assertion.") from exc
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise GrantError("invalid_grant", "Invalid JWT: malformed assertion.")
    if header.get("alg") != "RS256":
        raise GrantError("invalid_grant", BAD_SIGNATURE)
    key = keys.get(str(header.get("kid", "")))
    if key is None or key.revoked or claims.get("iss") != key.email:
        raise GrantError("invalid_grant", BAD_SIGNATURE)
    try:
        key.public_key.verify(
            signature,
            f"{header_b64}.{payload_b64}".encode(),
            padding.PKCS1v15(),
            hashes.SHA256(),
        )
    except InvalidSignature:
        raise GrantError("invalid_grant", BAD_SIGNATURE) from None
    if claims.get("aud") not in GOOGLE_TOKEN_AUDIENCES:
        raise GrantError("invalid_grant", "Invalid JWT: Failed audience check.")
    now = time.time() if now is None else now
    try:
        iat, exp = float(claims["iat"]), float(claims["exp"])
    except (KeyError, TypeError, ValueError):
        raise GrantError("invalid_grant", BAD_TIMEFRAME) from None
    if exp - iat > _MAX_ASSERTION_LIFETIME or iat > now + _CLOCK_SKEW or exp < now - _CLOCK_SKEW:
        raise GrantError("invalid_grant", BAD_TIMEFRAME)
    return key.key_id, claims
