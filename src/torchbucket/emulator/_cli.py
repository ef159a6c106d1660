"""``python -m torchbucket.emulator`` / ``torchbucket emulator``: run the server.

Prints one JSON line on stdout (``{"endpoint": "http://127.0.0.1:PORT", ...}``,
with ``admin_token``, the admin API's secret, in ``--auth`` mode) once the
server listens, then serves until SIGINT or SIGTERM, or, with
``--watch-stdin``, until its stdin closes (how :class:`Emulator` makes sure no
server outlives the process that started it).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchbucket.emulator._grpc_server import GrpcFront
    from torchbucket.emulator._server import FrontServer
    from torchbucket.emulator._token_service import TokenService

__all__ = ["main"]

logger = logging.getLogger(__name__)


_EPILOG = """\
examples:
  # a bucket, in one terminal (a fixed port keeps the address across restarts)
  torchbucket emulator --bucket my-bucket --port 4443

  # in another: point clients at it, upload, list
  export STORAGE_EMULATOR_HOST=http://127.0.0.1:4443
  torchbucket cp ./images gs://my-bucket/train/
  torchbucket ls gs://my-bucket/train/

  # more buckets while it runs
  torchbucket mb gs://another-bucket

  # a zonal (Rapid) bucket, and the gRPC API on port 4444 beside HTTP
  torchbucket emulator --zonal-bucket my-rapid --grpc-port 4444

  # answers as slow as a GCS bucket in your region (for benchmarks)
  torchbucket emulator --bucket my-bucket --latency same-region"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchbucket emulator",
        description="A local GCS endpoint on 127.0.0.1 (JSON and XML APIs) for tests,\n"
        "demos and benchmarks. It runs in the foreground until Ctrl-C and keeps\n"
        "everything in memory. Unless --port is given the port is a free one,\n"
        "different on every start: the endpoint is printed at start (a JSON line on\n"
        "stdout, and the export line on stderr). Point clients at it with\n"
        "STORAGE_EMULATOR_HOST=<endpoint>; re-export it after a restart.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="port on 127.0.0.1 (default 0: a free one, different on every start)",
    )
    parser.add_argument(
        "--backend",
        choices=("model", "fake-gcs"),
        default="model",
        help="model: in-memory store in the server (fast); fake-gcs: the fake-gcs-server binary",
    )
    parser.add_argument(
        "--latency",
        default="none",
        help="'none', 'same-region', 'same-region-tail' or a JSON LatencyModel, "
        'e.g. \'{"read": 0.01, "tail_p99": 5}\'',
    )
    parser.add_argument("--rps-cap", type=float, default=None, help="answer 429 above this rate")
    parser.add_argument(
        "--rate-model",
        default="none",
        help="GCS's request-rate behaviour: 'none', 'gcs', 'gcs-scaled' or a JSON "
        "RequestRateModel (capacity doubling under sustained load, 429/503 above it)",
    )
    parser.add_argument(
        "--min-part-size",
        type=int,
        default=0,
        help="smallest XML multipart part but the last, bytes (GCS: 5 MiB); default 0",
    )
    parser.add_argument(
        "--bucket", action="append", default=[], help="create this bucket at start (repeatable)"
    )
    parser.add_argument(
        "--zonal-bucket",
        action="append",
        default=[],
        help="create this zonal (Rapid) bucket at start (repeatable; model backend only)",
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="also serve the gRPC API (google.storage.v2, model backend only) on this port "
        "of 127.0.0.1 (0: a free one); default: no gRPC",
    )
    _add_access_args(parser)
    return parser


def _add_access_args(parser: argparse.ArgumentParser) -> None:
    """Logs, TLS, tokens and when to exit."""
    parser.add_argument("--fake-gcs-log", default=None, help="log file of fake-gcs-server")
    parser.add_argument(
        "--tls-cert",
        default=None,
        help="serve HTTPS with this PEM certificate chain (with --tls-key)",
    )
    parser.add_argument("--tls-key", default=None, help="the PEM private key of --tls-cert")
    parser.add_argument(
        "--auth",
        action="store_true",
        help="require a bearer token the emulator issued (401 otherwise), and serve a token "
        "endpoint and a GCE metadata server on a second port; the admin API then needs the "
        "x-emulator-admin-token header with the admin_token printed at start",
    )
    parser.add_argument(
        "--token-lifetime",
        type=int,
        default=3600,
        help="seconds each issued token is valid (with --auth); default 3600",
    )
    parser.add_argument(
        "--watch-stdin", action="store_true", help="exit when stdin reaches end of file"
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit when this process is no longer the parent",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator until interrupted.

    Args:
        argv: Command-line arguments without the program name (``sys.argv[1:]``
            when ``None``).

    Returns:
        The process exit status.
    """
    args = _parser().parse_args(argv)
    from torchbucket.emulator._latency import resolve_latency
    from torchbucket.errors import ConfigError

    latency_arg: object = args.latency
    if isinstance(latency_arg, str) and latency_arg.lstrip().startswith("{"):
        latency_arg = json.loads(latency_arg)
    try:
        latency = resolve_latency(latency_arg)  # type: ignore[arg-type]
    except ConfigError as exc:
        print(f"torchbucket emulator: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        uvloop = None
    try:
        if uvloop is not None:
            uvloop.run(_serve(args, latency))
        else:
            asyncio.run(_serve(args, latency))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        # The usual cause: an emulator started earlier on the same --port is
        # still running (in the background of this shell, or another one).
        print(
            f"torchbucket emulator: {exc}; is an emulator already running there? "
            "Stop it, or pick another --port (or none, for a free one)",
            file=sys.stderr,
        )
        return 1
    return 0


async def _serve(args: argparse.Namespace, latency: object) -> None:
    front = await _start_front(args, latency)
    tls = None
    if args.tls_cert:
        import ssl

        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    port = await front.start(args.port, ssl_context=tls)
    scheme = "https" if tls is not None else "http"
    token_service = None
    if args.auth:
        from torchbucket.emulator._auth import AuthState
        from torchbucket.emulator._token_service import TokenService

        front.auth = AuthState(token_lifetime=args.token_lifetime)
        # The admin API must not be open where GCS requests need a token.
        front.admin_token = secrets.token_urlsafe(32)
        token_service = TokenService(front.auth)
        await token_service.start()
    for bucket in args.bucket:
        await front.backend.create_bucket(bucket)
    for bucket in args.zonal_bucket:
        await front.backend.create_bucket(bucket, zonal=True)  # type: ignore[call-arg]
    grpc_front = None
    if args.grpc_port is not None:
        from torchbucket.emulator._grpc_server import GrpcFront

        grpc_front = GrpcFront(front)
        keys = None
        if args.tls_cert:
            with open(args.tls_key, "rb") as k, open(args.tls_cert, "rb") as c:
                keys = (k.read(), c.read())
        await grpc_front.start(args.grpc_port, tls=keys)
    _stop_on_exit_signals(args, front)
    _announce(args, front, scheme, port, token_service, grpc_front)
    await front.stopped.wait()
    if grpc_front is not None:
        await grpc_front.close()
    if token_service is not None:
        await token_service.close()
    try:
        await asyncio.wait_for(front.close(), timeout=5)
    except asyncio.TimeoutError:
        logger.warning("emulator did not stop within 5 s; exiting anyway")


async def _start_front(args: argparse.Namespace, latency: object) -> FrontServer:
    """The backend started, and the HTTP front server over it (not yet listening)."""
    from torchbucket.emulator._ratemodel import rate_model_arg
    from torchbucket.emulator._server import FrontServer

    backend: object
    if args.backend == "fake-gcs":
        from torchbucket.emulator._fakegcs import FakeGcsBackend

        backend = FakeGcsBackend(log_path=args.fake_gcs_log)
    else:
        from torchbucket.emulator._model_api import ModelBackend

        backend = ModelBackend()
    await backend.start()  # type: ignore[attr-defined]
    return FrontServer(
        backend,  # type: ignore[arg-type]
        latency=latency,  # type: ignore[arg-type]
        rps_cap=args.rps_cap,
        rate_model=rate_model_arg(args.rate_model),
        min_part_size=args.min_part_size,
    )


def _stop_on_exit_signals(args: argparse.Namespace, front: FrontServer) -> None:
    """Stop on SIGINT/SIGTERM, and at stdin's end or the parent's exit when asked to."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, front.stopped.set)
    if args.watch_stdin:
        fd = sys.stdin.fileno()

        def on_stdin() -> None:
            try:
                data = os.read(fd, 4096)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(fd)
                front.stopped.set()

        loop.add_reader(fd, on_stdin)
    if args.parent_pid is not None:
        # Forked children of the parent may keep the stdin pipe open after the
        # parent died; a changed parent pid says it is gone all the same.
        def check_parent() -> None:
            if os.getppid() != args.parent_pid:
                front.stopped.set()
            else:
                loop.call_later(1.0, check_parent)

        check_parent()


def _announce(
    args: argparse.Namespace,
    front: FrontServer,
    scheme: str,
    port: int,
    token_service: TokenService | None,
    grpc_front: GrpcFront | None,
) -> None:
    """The JSON line on stdout (what a parent process reads), and a note for people on stderr."""
    line = {
        "endpoint": f"{scheme}://127.0.0.1:{port}",
        "port": port,
        "backend": front.backend.name,
        "pid": os.getpid(),
        "backend_pid": front.backend.pid,
    }
    if token_service is not None:
        line["token_port"] = token_service.port
    if grpc_front is not None:
        line["grpc_endpoint"] = f"127.0.0.1:{grpc_front.port}"
        line["grpc_port"] = grpc_front.port
    if front.admin_token is not None:
        line["admin_token"] = front.admin_token
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    if args.watch_stdin:
        return
    sys.stderr.write(
        f"GCS emulator ({front.backend.name}) listening; point clients at it with\n"
        f"  export STORAGE_EMULATOR_HOST={scheme}://127.0.0.1:{port}\n"
        "Ctrl-C stops it.\n"
    )
    if grpc_front is not None:
        sys.stderr.write(
            f"gRPC (google.storage.v2): 127.0.0.1:{grpc_front.port} "
            "(ClientOptions(api_endpoint=...), an insecure channel)\n"
        )
    if token_service is not None:
        sys.stderr.write(
            f"Tokens: key files with token_uri http://127.0.0.1:{token_service.port}/token, "
            f"or GCE_METADATA_HOST=GCE_METADATA_IP=127.0.0.1:{token_service.port}\n"
            "Admin API (/_emulator/...): send the header "
            f"x-emulator-admin-token: {front.admin_token}\n"
        )
