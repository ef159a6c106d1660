"""The emulator's token service: an OAuth2 token endpoint and a GCE metadata server.

One small aiohttp server on its own ``127.0.0.1`` port, apart from the GCS
endpoint as Google's services are, serving what ``google-auth`` asks of them:

- ``POST /token``: the JWT-bearer grant that service-account credentials send
  (RFC 7523; the key file's ``token_uri`` points here). The assertion is checked
  against the registered public key (:func:`~torchbucket.emulator._sa_keys.verify_assertion`);
  a refusal is a 400 ``{"error": "invalid_grant", "error_description": ...}``
  as Google's endpoint gives it (RFC 6749 section 5.2), e.g. ``"Invalid JWT
  Signature."`` for a revoked key.
- The metadata server (``GCE_METADATA_HOST`` / ``GCE_METADATA_IP`` point here):
  ``GET /`` (google-auth's "am I on GCE" ping), and under ``/computeMetadata/v1/``
  the default service account's info and token, the project id and the
  universe domain. As on GCE
  (https://cloud.google.com/compute/docs/metadata/querying-metadata), a request
  without ``Metadata-Flavor: Google``, or with ``X-Forwarded-For``, gets 403, and
  every answer carries ``Metadata-Flavor: Google``. Like the real server, it
  hands out its current token, with the seconds it has left, until half its
  lifetime is gone.

Every token request is counted per client process: the peer's TCP port is
looked up in ``/proc/net/tcp`` and the socket's owner in ``/proc/*/fd`` (Linux;
elsewhere the client is ``"unknown"``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from urllib.parse import parse_qs

from aiohttp import web

from torchbucket.emulator._auth import AuthState
from torchbucket.emulator._sa_keys import GrantError, verify_assertion

__all__ = ["TokenService"]

logger = logging.getLogger(__name__)

_JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_METADATA_ROOT = "/computeMetadata/v1/"
_SA_ROOT = _METADATA_ROOT + "instance/service-accounts/"
_FLAVOR = {"Metadata-Flavor": "Google"}
_DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


class TokenService:
    """The token endpoint and metadata server of one emulator.

    Args:
        auth: The emulator's token state.
        email: The metadata server's default service account.
        project: The metadata server's project id.
    """

    def __init__(
        self,
        auth: AuthState,
        *,
        email: str = "default@emulator-project.iam.gserviceaccount.com",
        project: str = "emulator-project",
    ) -> None:
        self.auth = auth
        self.email = email
        self.project = project
        self.port = 0
        self._runner: web.ServerRunner | None = None
        self._metadata_token: str | None = None

    async def start(self) -> int:
        """Serve on a free ``127.0.0.1`` port; return it."""
        server = web.Server(self.handle, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, reuse_address=True)
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.auth.token_port = self.port
        return self.port

    async def close(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request."""
        path = request.path
        if path == "/token":
            return await self._token(request)
        if path == "/" or path.startswith("/computeMetadata/"):
            return await self._metadata(request, path)
        return web.Response(status=404, text="Not Found")

    async def _client(self, request: web.BaseRequest) -> str:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if not peer:
            return "unknown"
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _process_of, int(peer[1]), self.port)

    # ---------------------------------------------------------------- OAuth2

    async def _token(self, request: web.BaseRequest) -> web.Response:
        if request.method != "POST":
            return web.Response(status=405, text="Method Not Allowed")
        client = await self._client(request)
        self.auth.token_requests[client] += 1
        form = parse_qs((await request.read()).decode("utf-8", "replace"))
        grant = form.get("grant_type", [""])[0]
        if grant != _JWT_GRANT:
            return self._refused("unsupported_grant_type", f"Invalid grant_type: {grant}")
        assertion = form.get("assertion", [""])[0]
        if not assertion:
            return self._refused("invalid_request", "Missing required parameter: assertion")
        try:
            key_id, claims = verify_assertion(assertion, self.auth.keys)
        except GrantError as exc:
            return self._refused(exc.error, exc.description)
        scopes = frozenset(str(claims.get("scope", "")).split())
        token = self.auth.issue(scopes, key_id, client)
        return _json(
            {
                "access_token": token,
                "expires_in": self.auth.token_lifetime,
                "token_type": "Bearer",
            }
        )

    def _refused(self, error: str, description: str) -> web.Response:
        self.auth.grants_refused[error] += 1
        return _json({"error": error, "error_description": description}, status=400)

    # ---------------------------------------------------------------- metadata

    async def _metadata(self, request: web.BaseRequest, path: str) -> web.Response:
        headers = request.headers
        if "X-Forwarded-For" in headers:
            return _text("Request denied: X-Forwarded-For header present.", 403)
        if headers.get("Metadata-Flavor") != "Google":
            return _text('Missing required header: "Metadata-Flavor: Google".', 403)
        if request.method != "GET":
            return _text("Method not allowed.", 405)
        self.auth.metadata_requests += 1
        if path == "/":
            return _text("computeMetadata/\n")
        rest = path[len(_METADATA_ROOT) :] if path.startswith(_METADATA_ROOT) else None
        if rest == "project/project-id":
            return _text(self.project)
        if rest == "universe/universe-domain":
            return _text("googleapis.com")
        if path.startswith(_SA_ROOT):
            account, _, leaf = path[len(_SA_ROOT) :].partition("/")
            if account not in ("default", self.email):
                return _text("Not Found", 404)
            if leaf == "":
                return _json(
                    {"aliases": ["default"], "email": self.email, "scopes": list(_DEFAULT_SCOPES)},
                    flavor=True,
                )
            if leaf == "email":
                return _text(self.email)
            if leaf == "token":
                return await self._metadata_token_answer(request)
        return _text("Not Found", 404)

    async def _metadata_token_answer(self, request: web.BaseRequest) -> web.Response:
        client = await self._client(request)
        auth = self.auth
        auth.token_requests[client] += 1
        requested = request.query.get("scopes", "")
        scopes = frozenset(requested.replace(",", " ").split()) or frozenset(_DEFAULT_SCOPES)
        token = self._metadata_token
        left = auth.remaining(token) if token is not None else 0.0
        record = auth.tokens.get(token) if token is not None else None
        if record is None or left < auth.token_lifetime / 2 or record.scopes != scopes:
            token = self._metadata_token = auth.issue(scopes, None, client)
            left = float(auth.token_lifetime)
        return _json(
            {"access_token": token, "expires_in": max(1, int(left)), "token_type": "Bearer"},
            flavor=True,
        )


def _json(payload: object, status: int = 200, *, flavor: bool = False) -> web.Response:
    headers = {"Content-Type": "application/json", **(_FLAVOR if flavor else {})}
    return web.Response(status=status, body=json.dumps(payload).encode(), headers=headers)


def _text(text: str, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=text.encode(), headers={"Content-Type": "application/text", **_FLAVOR}
    )


def _process_of(peer_port: int, server_port: int) -> str:
    """The pid (as text) of the local process whose socket is ``peer_port`` -> ``server_port``."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 10:
                        continue
                    local_port = int(fields[1].rsplit(":", 1)[1], 16)
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    if local_port == peer_port and remote_port == server_port:
                        inode = fields[9]
                        break
        except OSError:
            continue
        if inode is not None:
            break
    if inode is None or inode == "0":
        return "unknown"
    target = f"socket:[{inode}]"
    t0 = time.perf_counter()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    logger.debug(
                        "peer %d is pid %s (%.1f ms)",
                        peer_port,
                        entry.name,
                        1e3 * (time.perf_counter() - t0),
                    )
                    return entry.name
            except OSError:
                continue
    return "unknown"
