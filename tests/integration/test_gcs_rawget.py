"""Large ranged reads (``GCSStore.get_into`` of at least 1 MiB) over the in-place
HTTP client of ``storage/gcs/_rawget.py``: against both emulators, with faults,
and against a scripted server for the answers it hands over to aiohttp."""

from __future__ import annotations

import datetime
import ipaddress
import random
import socketserver
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from torchbucket import runtime
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.errors import DeadlineExceededError, IntegrityError, NotFoundError
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.gcs import _rawget as _gcs_rawget

pytestmark = pytest.mark.emulator

MiB = 1 << 20
DATA = random.Random(5).randbytes(3 * MiB + 123)


def _read(store: Any, key: str, start: int, size: int) -> bytes:
    buffer = bytearray(size)
    got = runtime.run(store.get_into(key, memoryview(buffer), start=start))
    return bytes(buffer[:got])


def _connections_to(port: int) -> int:
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_the_threshold_is_what_these_tests_read_above() -> None:
    assert 2 * MiB >= _gcs_rawget.MIN_BYTES


@pytest.mark.parametrize("server", ["emulator", "fake_gcs"])
def test_large_ranges_land_in_the_buffer(
    request: pytest.FixtureRequest, gcs_bucket_factory: Any, server: str
) -> None:
    store = gcs_bucket_factory(request.getfixturevalue(server), prefix="raw")
    runtime.run(store.put("big", DATA))
    assert _read(store, "big", 0, len(DATA)) == DATA
    assert _read(store, "big", 1000, 2 * MiB) == DATA[1000 : 1000 + 2 * MiB]
    # A range running past the end returns what there is.
    assert _read(store, "big", 2 * MiB, 2 * MiB) == DATA[2 * MiB :]
    # Past the end altogether: nothing.
    assert _read(store, "big", len(DATA) + 10, 2 * MiB) == b""
    with pytest.raises(NotFoundError):
        _read(store, "missing", 0, 2 * MiB)


@pytest.mark.parametrize("server", ["emulator", "fake_gcs"])
@pytest.mark.parametrize("kind", ["503", "429", "reset", "truncate", "corrupt", "stall"])
def test_a_fault_on_a_large_read_is_ridden_out(
    request: pytest.FixtureRequest, gcs_bucket_factory: Any, server: str, kind: str
) -> None:
    emulator = request.getfixturevalue(server)
    store = gcs_bucket_factory(emulator, prefix="raw")
    runtime.run(store.put("big", DATA))
    rule = emulator.add_fault("get", kind, stall_seconds=1.0)
    # The whole object: a corrupted byte is caught by its CRC32C.
    assert _read(store, "big", 0, len(DATA)) == DATA
    fired = {r["id"]: r["fired"] for r in emulator.faults()}
    assert fired[rule] == 1, "the fault never reached the store"


def test_a_404_on_a_large_read_is_not_found(emulator: Any, gcs_bucket_factory: Any) -> None:
    store = gcs_bucket_factory(emulator, prefix="raw")
    runtime.run(store.put("big", DATA))
    emulator.add_fault("get", "404")
    with pytest.raises(NotFoundError, match="big"):
        _read(store, "big", 0, 2 * MiB)


def test_a_silent_server_is_cut_short_by_the_read_timeout(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    # No hedge: a new process's hedger would send a second GET after 0.28 s
    # (0.2 s plus 2 MiB at 25 MB/s) and rescue the read; the timeout is the point.
    store = gcs_bucket_factory(
        emulator,
        prefix="raw",
        retry=RetryConfig(max_attempts=1, read_timeout=0.3),
        hedge=HedgeConfig(enabled=False),
    )
    runtime.run(store.put("big", DATA))
    emulator.add_fault("get", "stall", stall_seconds=5.0)
    with pytest.raises(DeadlineExceededError, match="read timeout"):
        _read(store, "big", 0, 2 * MiB)
    # The connection cut short is not reused: the next read is whole.
    assert _read(store, "big", 0, len(DATA)) == DATA


def test_sequential_large_reads_share_one_connection(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    store = gcs_bucket_factory(emulator, prefix="raw")
    runtime.run(store.put("big", DATA))
    port = int(emulator.endpoint.rsplit(":", 1)[1])
    assert _read(store, "big", 0, 2 * MiB) == DATA[: 2 * MiB]
    opened = _connections_to(port)
    for start in (MiB, 0, 3000, MiB + 1):
        assert _read(store, "big", start, 2 * MiB) == DATA[start : start + 2 * MiB]
    assert _connections_to(port) == opened


# ---------------------------------------------------------------- a scripted server

Answer = Callable[[int, int, int, int], bytes | None]


class _Scripted(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.tls = tls
        self.connections = 0
        self.requests: list[str] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client hung up mid-answer: what some tests script
        super().handle_error(request, client_address)


class _Handler(socketserver.StreamRequestHandler):
    server: _Scripted

    def handle(self) -> None:
        with self.server.lock:
            self.server.connections += 1
        served = 0
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            lines = head.decode("latin-1").split("\r\n")
            with self.server.lock:
                self.server.requests.append(lines[0])
            range_value = next(
                (v for k, _, v in (x.partition(": ") for x in lines) if k.lower() == "range"),
                "bytes=0-",
            )
            first, _, last = range_value[6:].partition("-")
            end = min(int(last) + 1 if last else len(DATA), len(DATA))
            reply = self.server.answer(self.server.connections, served, int(first), end)
            if reply is None:
                return  # close without answering
            self.wfile.write(reply)
            self.wfile.flush()
            served += 1
            if b"Connection: close" in reply.partition(b"\r\n\r\n")[0]:
                return


def _partial(first: int, end: int, *, extra: bytes = b"", length: int | None = None) -> bytes:
    body = DATA[first:end]
    n = len(body) if length is None else length
    return (
        f"HTTP/1.1 206 Partial Content\r\nContent-Length: {n}\r\n"
        f"Content-Range: bytes {first}-{end - 1}/{len(DATA)}\r\n"
        f"{extra.decode()}\r\n"
    ).encode() + body


def _chunked(first: int, end: int) -> bytes:
    body = DATA[first:end]
    return (
        (
            f"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n"
            f"Content-Range: bytes {first}-{end - 1}/{len(DATA)}\r\n\r\n"
            f"{len(body):x}\r\n"
        ).encode()
        + body
        + b"\r\n0\r\n\r\n"
    )


def _whole(first: int, end: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(DATA)}\r\n\r\n".encode() + DATA


def _until_close(first: int, end: int) -> bytes:
    return (
        f"HTTP/1.1 206 Partial Content\r\nConnection: close\r\n"
        f"Content-Range: bytes {first}-{end - 1}/{len(DATA)}\r\n\r\n"
    ).encode() + DATA[first:end]


Start = Callable[..., tuple[_Scripted, GCSStore]]


@pytest.fixture
def scripted() -> Iterator[Start]:
    """``start(answer, attempts=1, tls=None)``: a scripted server and a store reading from it."""
    servers: list[_Scripted] = []
    stores: list[GCSStore] = []

    def start(
        answer: Answer,
        attempts: int = 1,
        tls: ssl.SSLContext | None = None,
        read_timeout: float = 5.0,
    ) -> tuple[_Scripted, GCSStore]:
        server = _Scripted(answer, tls)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        store = GCSStore(
            f"t-{uuid.uuid4().hex[:16]}",
            config=GCSConfig(
                endpoint=server.endpoint,
                anonymous=True,
                retry=RetryConfig(
                    max_attempts=attempts, initial_backoff=0.01, read_timeout=read_timeout
                ),
            ),
        )
        stores.append(store)
        return server, store

    yield start
    for store in stores:
        runtime.run(store.close())
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("reply", [_chunked, _whole, _until_close])
def test_an_answer_it_does_not_read_is_read_through_aiohttp(
    scripted: Start, reply: Callable[[int, int], bytes]
) -> None:
    server, store = scripted(lambda conn, served, first, end: reply(first, end))
    start = 1000
    assert _read(store, "obj", start, 2 * MiB) == DATA[start : start + 2 * MiB]
    # Asked twice: by the in-place client, then through aiohttp.
    assert len(server.requests) == 2


def test_a_pooled_connection_the_server_dropped_is_replaced_without_an_attempt(
    scripted: Start,
) -> None:
    # Every connection answers one request, then closes on the next one unanswered.
    server, store = scripted(
        lambda conn, served, first, end: _partial(first, end) if served == 0 else None
    )
    for start in (0, 5000, MiB):
        assert _read(store, "obj", start, 2 * MiB) == DATA[start : start + 2 * MiB]
    assert server.connections == 3


def test_keep_alive_connections_are_reused(
    scripted: Start,
) -> None:
    server, store = scripted(lambda conn, served, first, end: _partial(first, end))
    for start in (0, 5000, MiB):
        assert _read(store, "obj", start, 2 * MiB) == DATA[start : start + 2 * MiB]
    assert server.connections == 1


def test_a_connection_that_sent_more_than_its_answer_is_not_reused(scripted: Start) -> None:
    server, store = scripted(lambda conn, served, first, end: _partial(first, end) + b"junk")
    for start in (0, 5000):
        assert _read(store, "obj", start, 2 * MiB) == DATA[start : start + 2 * MiB]
    assert server.connections == 2


def test_an_answer_longer_than_the_range_is_an_integrity_error(
    scripted: Start,
) -> None:
    _, store = scripted(
        lambda conn, served, first, end: _partial(first, end, length=end - first + 10)
    )
    # A checksum or length mismatch is retried like a transient error; when it
    # persists until the deadline the caller sees the IntegrityError itself.
    with pytest.raises(IntegrityError, match="obj"):
        _read(store, "obj", 0, 2 * MiB)


def test_a_body_cut_short_is_retried(
    scripted: Start,
) -> None:
    # The first connection announces the range and sends half of it.
    def answer(conn: int, served: int, first: int, end: int) -> bytes:
        reply = _partial(first, end)
        return reply[: len(reply) - (end - first) // 2] if conn == 1 else reply

    # The rest never comes: the read timeout (1 s here) ends the attempt.
    server, store = scripted(answer, attempts=3, read_timeout=1.0)
    assert _read(store, "obj", 0, 2 * MiB) == DATA[: 2 * MiB]
    assert server.connections == 2


def test_an_unanswered_request_on_a_fresh_connection_fails_the_attempt(
    scripted: Start,
) -> None:
    _, store = scripted(lambda conn, served, first, end: None)
    with pytest.raises(DeadlineExceededError, match="connection"):
        _read(store, "obj", 0, 2 * MiB)


def _certificate(directory: Any) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "torchbucket test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


@pytest.mark.skipif(not _gcs_rawget.supported("https://x"), reason="HTTPS in place needs 3.11")
def test_https_ranges_are_read_in_place_over_one_connection(
    scripted: Start, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _certificate(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    # The client trusts the test certificate (instead of the system's roots),
    # named the standard way.
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    server, store = scripted(lambda conn, served, first, end: _partial(first, end), tls=server_tls)
    for start in (0, 5000, MiB):
        assert _read(store, "obj", start, 2 * MiB) == DATA[start : start + 2 * MiB]
    assert server.connections == 1
    assert len(server.requests) == 3  # none repeated through aiohttp


_FORK_SCRIPT = """
import multiprocessing, sys, warnings
warnings.simplefilter("always")
from torchbucket import runtime
from torchbucket.storage import store_for

store, key = store_for(sys.argv[1])
data = bytes(range(256)) * 8192  # 2 MiB
runtime.run(store.put(key, data))

def read():
    buffer = bytearray(len(data))
    runtime.run(store.get_into(key, memoryview(buffer)))
    return bytes(buffer)

def child(q):
    q.put(read() == data)

if __name__ == "__main__":
    assert read() == data  # the parent's pool holds a connection when it forks
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        assert q.get(timeout=60), method
        p.join()
        assert p.exitcode == 0, (method, p.exitcode)
    assert read() == data
    print("ok")
"""


def test_forked_and_spawned_children_read_in_place_and_exit_cleanly(
    run_child_script: Callable[[str], subprocess.CompletedProcess[str]],
) -> None:
    done = run_child_script(_FORK_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "unclosed" not in done.stderr.lower()  # asyncio's transports, aiohttp's sessions
    assert "Traceback" not in done.stderr
