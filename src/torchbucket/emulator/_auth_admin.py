"""The ``Emulator`` handle's side of "auth required" mode: keys, tokens, counters.

Mixed into :class:`torchbucket.emulator.Emulator`; the server side is
:mod:`torchbucket.emulator._auth` and :mod:`torchbucket.emulator._token_service`.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from torchbucket.errors import ConfigError, StorageError

__all__ = ["AuthAdmin"]


class AuthAdmin:
    """Methods of :class:`~torchbucket.emulator.Emulator` for its token service."""

    auth: bool
    _token_port: int | None

    if TYPE_CHECKING:

        def _admin(
            self,
            method: str,
            path: str,
            payload: Any = None,
            *,
            data: bytes | None = None,
            content_type: str = "application/json",
            timeout: float = 300.0,
        ) -> Any: ...

    def _token_host(self) -> str:
        if not self.auth:
            raise ConfigError("the emulator was started without auth=True: it issues no tokens")
        if self._token_port is None:
            raise StorageError("the emulator is not running", operation="emulator")
        return f"127.0.0.1:{self._token_port}"

    @property
    def token_uri(self) -> str:
        """The OAuth2 token endpoint (a key file's ``token_uri``).

        Raises:
            ConfigError: The emulator does not require auth.
        """
        return f"http://{self._token_host()}/token"

    @property
    def metadata_host(self) -> str:
        """``127.0.0.1:PORT`` of the metadata server: the value for both
        ``GCE_METADATA_HOST`` (token requests) and ``GCE_METADATA_IP`` (the ping
        google-auth sends to decide it runs on GCE).

        Raises:
            ConfigError: The emulator does not require auth.
        """
        return self._token_host()

    def metadata_env(self) -> dict[str, str]:
        """Environment variables that point google-auth at the metadata server.

        google-auth reads ``GCE_METADATA_HOST`` when ``google.auth.compute_engine``
        is first imported, so set them before that (in a child process's
        environment, typically).
        """
        host = self.metadata_host
        return {"GCE_METADATA_HOST": host, "GCE_METADATA_IP": host}

    def service_account_key(
        self,
        path: str | os.PathLike[str],
        *,
        email: str = "trainer@emulator-project.iam.gserviceaccount.com",
    ) -> dict[str, str]:
        """Create a service-account key and write its JSON key file to ``path``.

        The key file is what ``gcloud iam service-accounts keys create`` writes,
        with ``token_uri`` set to :attr:`token_uri`; point
        ``GOOGLE_APPLICATION_CREDENTIALS`` at it. The private key stays in the
        file; the emulator keeps only the public key.

        Returns:
            ``{"path", "private_key_id", "client_email"}``.

        Raises:
            ConfigError: The emulator does not require auth.
        """
        from torchbucket.emulator._sa_keys import new_key_file

        key_file, public_pem = new_key_file(token_uri=self.token_uri, email=email)
        self._admin(
            "POST",
            "auth/keys",
            {
                "key_id": key_file["private_key_id"],
                "email": email,
                "public_key_pem": public_pem,
            },
        )
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(key_file, f)
        return {
            "path": os.fspath(path),
            "private_key_id": key_file["private_key_id"],
            "client_email": email,
        }

    def revoke_key(self, key_id: str) -> int:
        """Revoke a key: its grants get ``invalid_grant`` and its tokens 401.

        Returns:
            How many of its tokens were still valid.
        """
        quoted = urllib.parse.quote(key_id, safe="")
        return int(self._admin("POST", f"auth/keys/{quoted}/revoke", {})["tokens_revoked"])

    def expire_tokens(self) -> int:
        """Expire every issued token now (the next request with one gets 401).

        Returns:
            How many tokens were still valid.
        """
        return int(self._admin("POST", "auth/tokens/expire", {})["tokens_expired"])

    def auth_stats(self) -> dict[str, Any]:
        """The token service's counters since start or :meth:`reset_auth_stats`.

        Returns:
            ``token_requests`` (per client pid, as text; grants and metadata
            token requests, refused ones included), ``metadata_requests``,
            ``grants_refused`` (by OAuth error), ``rejected`` (GCS requests
            refused, by cause: ``missing``, ``unknown``, ``expired``,
            ``revoked``, ``scope``), ``accepted``, ``token_lifetime`` and
            ``keys``.
        """
        return dict(self._admin("GET", "auth/stats"))

    def reset_auth_stats(self) -> None:
        """Zero the token service's counters."""
        self._admin("DELETE", "auth/stats")
