"""The emulator as a process: rps cap, counters, seeding, binding, lifetime, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from torchbucket.emulator import Emulator, LatencyModel, generated_bytes
from torchbucket.errors import ConfigError

pytestmark = pytest.mark.emulator

Http = Callable[..., Any]


def _bucket(emu: Emulator) -> str:
    name = f"s-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    return name


def test_rps_cap_answers_429_with_retry_after(emulator: Emulator, raw_http: Http) -> None:
    bucket = _bucket(emulator)
    emulator.set_rps_cap(2.0)
    replies = [raw_http(emulator, "GET", f"/storage/v1/b/{bucket}/o") for _ in range(10)]
    throttled = [r for r in replies if r.status == 429]
    assert throttled, [r.status for r in replies]
    assert int(throttled[0].headers["Retry-After"]) >= 1
    assert throttled[0].json()["error"]["code"] == 429
    assert emulator.stats()["throttled"] >= len(throttled)
    emulator.set_rps_cap(None)
    assert all(
        raw_http(emulator, "GET", f"/storage/v1/b/{bucket}/o").status == 200 for _ in range(10)
    )


def test_stats_count_requests_by_class_op_and_status(emulator: Emulator, raw_http: Http) -> None:
    bucket = _bucket(emulator)
    emulator.reset_stats()
    o = f"/storage/v1/b/{bucket}/o"
    raw_http(emulator, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=a", b"1")
    raw_http(emulator, "GET", o)  # list
    raw_http(emulator, "GET", f"{o}/a?alt=media")  # get
    raw_http(emulator, "GET", f"{o}/a")  # head (metadata)
    raw_http(emulator, "GET", f"{o}/missing?alt=media")  # get, 404
    raw_http(
        emulator,
        "POST",
        f"{o}/c/compose",
        json.dumps({"sourceObjects": [{"name": "a"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    raw_http(emulator, "DELETE", f"{o}/a")  # free
    stats = emulator.stats()
    assert stats["requests"] == 7
    assert stats["by_class"] == {"A": 3, "B": 3, "free": 1}
    assert stats["by_op"] == {"put": 1, "list": 1, "get": 2, "head": 1, "compose": 1, "delete": 1}
    assert stats["by_status"] == {"200": 5, "404": 1, "204": 1}
    assert stats["bytes_out"] > 0
    assert stats["cpu_seconds"] > 0
    assert stats["pid"] == emulator.pid


def test_seeding_100k_objects_into_the_model_store(emulator: Emulator, raw_http: Http) -> None:
    bucket = _bucket(emulator)
    emulator.seed_generated(bucket, count=100_000, size=64, prefix="img/", names="hashed", seed=7)
    names = emulator.object_names(bucket)
    assert len(names) == 100_000
    assert names == sorted(names)
    page = raw_http(emulator, "GET", f"/storage/v1/b/{bucket}/o?prefix=img/").json()
    assert len(page["items"]) == 1000 and "nextPageToken" in page
    name = names[12_345]
    body = raw_http(
        emulator, "GET", f"/storage/v1/b/{bucket}/o/{name.replace('/', '%2F')}?alt=media"
    )
    assert body.body == generated_bytes(name, 64, seed=7)


def test_seed_from_a_mapping(emulator: Emulator, raw_http: Http) -> None:
    bucket = _bucket(emulator)
    objects = {f"k/{i:05d}": os.urandom(i % 50) for i in range(5000)}
    assert emulator.seed(bucket, objects) == 5000
    assert emulator.object_names(bucket, "k/") == sorted(objects)
    got = raw_http(emulator, "GET", f"/storage/v1/b/{bucket}/o/k%2F00049?alt=media")
    assert got.body == objects["k/00049"]


def test_servers_listen_on_loopback_only(emulator: Emulator, fake_gcs: Emulator) -> None:
    pids = [emulator.pid, fake_gcs.pid, fake_gcs.backend_pid]
    for pid in pids:
        assert pid is not None
        listening = [
            c for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN
        ]
        assert listening, pid
        assert {c.laddr.ip for c in listening} == {"127.0.0.1"}
    assert emulator.endpoint.startswith("http://127.0.0.1:")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_no_server_outlives_the_process_that_started_it() -> None:
    script = (
        "import json, sys, time\n"
        "from torchbucket.emulator import Emulator\n"
        "emu = Emulator(backend='fake-gcs').start()\n"
        "print(json.dumps([emu.pid, emu.backend_pid]), flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    pids = json.loads(parent.stdout.readline())
    assert all(psutil.pid_exists(pid) for pid in pids)
    parent.kill()  # SIGKILL: no atexit, no finalizers
    parent.wait()
    deadline = time.monotonic() + 20
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids)


def test_command_line_prints_its_endpoint_and_stops_on_sigterm(raw_http: Http) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchbucket.emulator", "--port", "0", "--bucket", "cli-bucket"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["endpoint"] == f"http://127.0.0.1:{info['port']}"
        reply = raw_http(
            SimpleNamespace(endpoint=info["endpoint"]), "GET", "/storage/v1/b/cli-bucket"
        )
        assert reply.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_latency_can_be_set_and_is_reported(emulator: Emulator, raw_http: Http) -> None:
    model = LatencyModel(read=0.001, list_page=0.002, write=0.003, bandwidth=None)
    emulator.set_latency(model)
    current = raw_http(emulator, "GET", "/_emulator/latency").json()["latency"]
    assert current == {
        "read": 0.001,
        "list_page": 0.002,
        "write": 0.003,
        "bandwidth": None,
        "tail_p99": 1.0,
        "stall_probability": 0.0,
        "stall_seconds": 0.0,
        "seed": 0,
    }
    emulator.set_latency("same-region-tail")
    tail = raw_http(emulator, "GET", "/_emulator/latency").json()["latency"]
    assert (tail["tail_p99"], tail["stall_probability"], tail["stall_seconds"]) == (5.0, 0.001, 2.0)
    emulator.set_latency("same-region")
    assert raw_http(emulator, "GET", "/_emulator/latency").json()["latency"]["read"] == 0.020
    with pytest.raises(ConfigError):
        emulator.set_latency("far-away")


def test_a_stalled_write_is_applied_before_or_after_its_stall(emulator: Emulator) -> None:
    # Every write stalls 1 s, half of them before the store applies it: while
    # the upload is held, its object is there for some and not for others
    # (the admin API, which sees the store directly, is not delayed).
    from torchbucket import runtime
    from torchbucket.storage.gcs import GCSConfig, GCSStore

    bucket = _bucket(emulator)
    store = GCSStore(bucket, config=GCSConfig(endpoint=emulator.endpoint, anonymous=True))
    emulator.set_latency(
        LatencyModel(
            read=0.0,
            list_page=0.0,
            write=0.0,
            bandwidth=None,
            stall_probability=1.0,
            stall_seconds=1.0,
            seed=5,
        )
    )
    seen = []
    emulator.reset_stats()
    try:
        for i in range(8):
            upload = runtime.submit(store.put(f"w/{i}", b"x"))
            time.sleep(0.4)
            seen.append(f"w/{i}" in emulator.object_names(bucket, "w/"))
            upload.result(timeout=30)
        stalls = emulator.stats()["stalls"]
    finally:
        emulator.set_latency(None)
        runtime.run(store.close())
    assert True in seen and False in seen, seen
    # The server counts each stall where it fell: an upload held before it
    # was applied is one whose object was not there yet.
    assert stalls == {"put:before": seen.count(False), "put:after": seen.count(True)}
    assert emulator.object_names(bucket, "w/") == [f"w/{i}" for i in range(8)]


def test_big_bodies_arrive_intact_under_the_bandwidth_model(
    emulator: Emulator, raw_http: Http
) -> None:
    bucket = _bucket(emulator)
    data = os.urandom(5 << 20)  # above the size streamed at the modelled rate
    emulator.seed(bucket, {"big": data})
    emulator.set_latency(LatencyModel(read=0.0, list_page=0.0, write=0.0, bandwidth=2e9))
    whole = raw_http(emulator, "GET", f"/storage/v1/b/{bucket}/o/big?alt=media")
    assert whole.status == 200 and whole.body == data
    assert whole.headers["x-goog-hash"].startswith("crc32c=")
    head = raw_http(emulator, "HEAD", f"/{bucket}/big")
    assert head.status == 200 and head.headers["Content-Length"] == str(len(data))


def test_constructor_options_reach_the_server(raw_http: Http) -> None:
    with Emulator(latency="same-region", rps_cap=1.0) as emu:
        assert raw_http(emu, "GET", "/_emulator/latency").json()["latency"]["list_page"] == 0.060
        statuses = [raw_http(emu, "GET", "/storage/v1/b").status for _ in range(3)]
        assert statuses[0] == 200 and 429 in statuses
    assert not emu.running


def test_server_keeps_freed_memory_unless_the_environment_says_otherwise(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session's emulator runs with the heap-only settings (benchmarks rely on
    # them so that the server's page faults do not set the pace)...
    env = psutil.Process(emulator.pid).environ()
    assert env["MALLOC_MMAP_MAX_"] == "0"
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 40
    # ...and a user's own malloc settings win.
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")
    with Emulator() as emu:
        assert psutil.Process(emu.pid).environ()["MALLOC_MMAP_MAX_"] == "65536"
