"""A local GCS endpoint for tests, demos and benchmarks.

:class:`Emulator` runs a front server in a subprocess on a free ``127.0.0.1``
port, speaking the subset of the GCS JSON and XML APIs that torchbucket and
``google-cloud-storage`` use, with one of two stores behind it:

- ``"model"``: an in-memory store in the server itself (O(1) object lookups,
  O(page) list pages; seeding 100,000 objects takes seconds), for benchmarks,
  scale tests and the demo, where the server must cost far less than the
  clients being measured;
- ``"fake-gcs"``: the real ``fake-gcs-server`` binary, the fidelity reference
  (small sizes only: it scans the bucket on every lookup).

In both modes the front server models latency and bandwidth
(:class:`LatencyModel`: preset ``"same-region"``, every request of a class
taking its median, or ``"same-region-tail"``, seeded draws with a tail and rare
stalls), caps list pages at 1,000
entries, can answer 429 above a requests-per-second cap, injects faults by rule
(``add_fault``), implements the XML multipart upload API and
``testIamPermissions``, and counts requests by class with its own CPU time
(``stats``)::

    with Emulator(latency="same-region") as emu:
        emu.create_bucket("data")
        emu.seed("data", {"a/1.bin": b"..."})
        store = GCSStore("data", config=GCSConfig(endpoint=emu.endpoint))

With ``grpc=True`` it also serves the gRPC API (google.storage.v2: bidi reads
and appendable writes among others, and the storage layout call) on
:attr:`Emulator.grpc_endpoint`, over the same store, and
``create_bucket(name, zonal=True)`` makes a zonal (Rapid) bucket::

    with Emulator(grpc=True) as emu:
        emu.create_bucket("rapid", zonal=True)
        client = AsyncGrpcClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=emu.grpc_endpoint),
        )
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from types import TracebackType
from typing import Any, Literal

from torchbucket.emulator._auth_admin import AuthAdmin
from torchbucket.emulator._cli import main
from torchbucket.emulator._data_admin import DataAdmin
from torchbucket.emulator._faults import FAULT_KINDS, OPERATIONS
from torchbucket.emulator._latency import PRESETS, LatencyModel, resolve_latency
from torchbucket.emulator._ratemodel import RATE_PRESETS, RequestRateModel, resolve_rate_model
from torchbucket.emulator._seed import generated_bytes, generated_names
from torchbucket.emulator._tls import admin_opener, make_certs
from torchbucket.errors import ConfigError, StorageError

__all__ = [
    "FAULT_KINDS",
    "OPERATIONS",
    "PRESETS",
    "RATE_PRESETS",
    "Emulator",
    "LatencyModel",
    "RequestRateModel",
    "generated_bytes",
    "generated_names",
    "main",
    "resolve_latency",
]

logger = logging.getLogger(__name__)

_START_TIMEOUT = 60.0
#: glibc malloc settings for the server process, unless the environment sets
#: them: every allocation from the heap, and freed memory kept for reuse. By
#: default a large body (a multipart part, an assembled upload) is a fresh
#: mmap whose pages fault in one by one: assembling a 512 MiB upload from its
#: parts cost the server 0.25-0.29 CPU seconds, against 0.05 s with these
#: settings once the heap has grown, here, so the server's CPU no longer sets
#: the pace of a checkpoint save for every contender. The price: the server
#: keeps its peak memory until it exits.
_SERVER_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}

# Admin calls bypass any proxy configured in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _stop_process(proc: subprocess.Popen[bytes], owner: int) -> None:
    if os.getpid() != owner:  # a forked child: the server is its parent's to stop
        return
    if proc.poll() is not None:
        return
    if proc.stdin is not None:
        try:
            proc.stdin.close()  # the server exits when its stdin closes
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Emulator(DataAdmin, AuthAdmin):
    """A local GCS emulator in a subprocess, as a context manager.

    Args:
        backend: ``"model"`` (in-memory, fast) or ``"fake-gcs"`` (the
            fake-gcs-server binary). Default ``"model"``.
        latency: ``None`` (no modelled latency), a preset name (``"same-region"``,
            ``"same-region-tail"``) or a :class:`LatencyModel`. Default ``None``.
        rps_cap: Requests per second above which the server answers 429 with
            ``Retry-After``, or ``None`` for no cap. Default ``None``.
        rate_model: GCS's request-rate behaviour (capacity that starts low
            and doubles under sustained load, 429/503 above it): a preset name
            (``"gcs"``, ``"gcs-scaled"``), a ``RequestRateModel`` or ``None``
            (off). Default ``None``. See ``torchbucket.emulator._ratemodel``.
        min_part_size: Smallest XML multipart part but the last, bytes (GCS
            itself requires 5 MiB). Default 0: no minimum.
        log_path: File for the server's stderr (and fake-gcs-server's output);
            a temporary file when ``None``.
        auth: Require a bearer token the emulator issued on every request (401
            as GCS answers it otherwise), and serve an OAuth2 token endpoint
            (:attr:`token_uri`, for :meth:`service_account_key` files) and a GCE
            metadata server (:meth:`metadata_env`) on a second port. Clients
            then need ``GCSConfig(anonymous=False)``, and the admin API needs
            :attr:`admin_token` (this handle sends it). Default ``False``.
        token_lifetime: Seconds each issued token is valid, with ``auth``.
            Default 3600, as Google's.
        tls: Serve HTTPS (``https://127.0.0.1:PORT``) with a certificate from a
            CA made for this emulator; clients trust :attr:`ca_file` through
            ``SSL_CERT_FILE`` / ``REQUESTS_CA_BUNDLE``. Needs ``trustme``.
            Default ``False``.
        grpc: Serve the gRPC API too (google.storage.v2 and the storage
            layout call, model store only) on a port of its own,
            :attr:`grpc_endpoint`, with the same store, latency, faults,
            auth and counters (``torchbucket.emulator._grpc_server``); needs
            ``grpcio`` and ``google-cloud-storage`` (``torchbucket[rapid]``).
            Default ``False``.

    Raises:
        ConfigError: A bad argument.
    """

    def __init__(
        self,
        backend: Literal["model", "fake-gcs"] = "model",
        latency: str | LatencyModel | None = None,
        rps_cap: float | None = None,
        *,
        min_part_size: int = 0,
        log_path: str | None = None,
        auth: bool = False,
        token_lifetime: int = 3600,
        tls: bool = False,
        rate_model: str | RequestRateModel | None = None,
        grpc: bool = False,
    ) -> None:
        if backend not in ("model", "fake-gcs"):
            raise ConfigError(f"Emulator backend must be 'model' or 'fake-gcs', got {backend!r}")
        if rps_cap is not None and rps_cap <= 0:
            raise ConfigError(f"Emulator rps_cap must be > 0 or None, got {rps_cap!r}")
        if min_part_size < 0:
            raise ConfigError(f"Emulator min_part_size must be >= 0, got {min_part_size!r}")
        if grpc and backend != "model":
            raise ConfigError("Emulator grpc=True needs backend='model'")
        self.backend = backend
        self._latency = resolve_latency(latency)
        self.rps_cap = rps_cap
        self.rate_model = resolve_rate_model(rate_model)
        self.min_part_size = min_part_size
        self.log_path = log_path
        if token_lifetime < 1:
            raise ConfigError(f"Emulator token_lifetime must be >= 1, got {token_lifetime!r}")
        self.auth = auth
        self.token_lifetime = token_lifetime
        self._token_port: int | None = None
        #: With ``auth``, the secret the admin API (``/_emulator/...``) needs in
        #: the ``x-emulator-admin-token`` header, made at start; sent by every
        #: method of this handle. ``None`` without ``auth`` (the admin API is open).
        self.admin_token: str | None = None
        self.tls = tls
        self.grpc = grpc
        #: With ``grpc``, the gRPC API's ``127.0.0.1:PORT`` (what
        #: ``ClientOptions(api_endpoint=...)`` takes) while it runs; else ``None``.
        self.grpc_endpoint: str | None = None
        #: With ``grpc``, its port; else ``None``.
        self.grpc_port: int | None = None
        #: With ``tls``, the CA file a client must trust (SSL_CERT_FILE,
        #: REQUESTS_CA_BUNDLE) while the emulator runs; else ``None``.
        self.ca_file: str | None = None
        self._tls_dir: str | None = None
        self._opener = _OPENER
        self._proc: subprocess.Popen[bytes] | None = None
        self._endpoint: str | None = None
        self.pid: int | None = None
        self.backend_pid: int | None = None
        # Whether fault rules may be active (set by add_fault, cleared by clear_faults).
        self.faults_active = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server.

        Raises:
            StorageError: The emulator is not running.
        """
        if self._endpoint is None:
            raise StorageError("the emulator is not running", operation="emulator")
        return self._endpoint

    @property
    def latency(self) -> LatencyModel | None:
        """The latency model in force (``None``: no modelled latency)."""
        return self._latency

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Emulator:
        """Start the server process and wait for its endpoint.

        Returns:
            ``self``.

        Raises:
            StorageError: The server did not start (its log is quoted).
        """
        if self._proc is not None:
            return self
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="torchbucket-emulator-", suffix=".log")
            os.close(fd)
        cmd = [sys.executable, "-m", "torchbucket.emulator", "--port", "0", "--watch-stdin"]
        cmd += ["--parent-pid", str(os.getpid())]
        cmd += ["--backend", self.backend, "--min-part-size", str(self.min_part_size)]
        cmd += ["--latency", json.dumps(self._latency.to_dict()) if self._latency else "none"]
        cmd += ["--fake-gcs-log", self.log_path]
        if self.tls:
            self._tls_dir = tempfile.mkdtemp(prefix="torchbucket-emulator-tls-")
            self.ca_file, cert_file, key_file = make_certs(self._tls_dir)
            self._opener = admin_opener(self.ca_file)
            cmd += ["--tls-cert", cert_file, "--tls-key", key_file]
        if self.rps_cap is not None:
            cmd += ["--rps-cap", str(self.rps_cap)]
        if self.rate_model is not None:
            cmd += ["--rate-model", json.dumps(self.rate_model.to_dict())]
        if self.auth:
            cmd += ["--auth", "--token-lifetime", str(self.token_lifetime)]
        if self.grpc:
            cmd += ["--grpc-port", "0"]
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                close_fds=True,
                env={**_SERVER_MALLOC, **os.environ},
            )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _stop_process, proc, os.getpid())
        try:
            line = self._read_line(proc)
            info = json.loads(line)
        except (ValueError, OSError, StorageError) as exc:
            self.stop()
            raise StorageError(
                f"the emulator did not start: {exc}; log {self.log_path}:\n{self._log_tail()}",
                operation="emulator start",
            ) from exc
        self._endpoint = str(info["endpoint"])
        self.pid = int(info["pid"])
        self.backend_pid = info.get("backend_pid")
        self._token_port = info.get("token_port")
        self.admin_token = info.get("admin_token")
        self.grpc_endpoint = info.get("grpc_endpoint")
        self.grpc_port = info.get("grpc_port")
        logger.debug("emulator (%s) listening at %s", self.backend, self._endpoint)
        return self

    @staticmethod
    def _read_line(proc: subprocess.Popen[bytes]) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StorageError(f"no endpoint within {_START_TIMEOUT} s")
                if not sel.select(timeout=min(left, 0.5)):
                    if proc.poll() is not None:
                        raise StorageError(f"server exited with status {proc.returncode}")
                    continue
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise StorageError(f"server exited with status {proc.wait()}")
                buf += chunk
        proc.stdout.close()
        return buf.split(b"\n", 1)[0].decode()

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop_process once
            self._finalizer = None
        self._proc = None
        self._endpoint = None
        self._token_port = None
        self.admin_token = None
        self.grpc_endpoint = None
        self.grpc_port = None
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
            self._tls_dir = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Emulator(backend={self.backend!r}, endpoint={self._endpoint!r})"

    # -- admin API -----------------------------------------------------------

    def _admin(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        data: bytes | None = None,
        content_type: str = "application/json",
        timeout: float = 300.0,
    ) -> Any:
        url = f"{self.endpoint}/_emulator/{path}"
        if payload is not None:
            data = json.dumps(payload).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.admin_token is not None:
            req.add_header("x-emulator-admin-token", self.admin_token)
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                message = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = body.decode("utf-8", "replace")
            cls = ConfigError if exc.code == 400 else StorageError
            if cls is ConfigError:
                raise ConfigError(f"emulator {path}: {message}") from exc
            raise StorageError(
                f"emulator admin call failed: {message}",
                operation=f"emulator {path}",
                uri=url,
                status=exc.code,
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise StorageError(
                f"emulator admin call failed: {exc}", operation=f"emulator {path}", uri=url
            ) from exc
