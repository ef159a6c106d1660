"""Request counters by GCS operation class, operation and status, and server CPU.

Classes follow GCS pricing: class A are writes, lists, compose, copy/rewrite/move,
bucket creation and the XML multipart calls; class B are reads, metadata reads,
bucket reads and permission checks; deletes (of objects, buckets and
multipart uploads) are free, as on GCS, and counted under ``"free"``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from torchbucket._opclass import OP_CLASS

__all__ = ["OP_CLASS", "Stats", "backend_cpu_seconds"]


class Stats:
    """Counters of one server since start or the last reset."""

    __slots__ = (
        "_cpu0",
        "_t0",
        "by_bucket",
        "by_class",
        "by_op",
        "by_rpc",
        "by_status",
        "bytes_in",
        "bytes_out",
        "faults",
        "requests",
        "stalls",
        "throttled",
    )

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero every counter and restart the CPU and wall clocks."""
        self.requests = 0
        self.by_class: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()
        # gRPC calls by method (each also counted under its operation in by_op).
        self.by_rpc: Counter[str] = Counter()
        self.by_status: Counter[int] = Counter()
        self.faults: Counter[str] = Counter()
        # Stalls the latency model drew, as "<op>:before" / "<op>:after" (the
        # request applied after its stall, or its answer held after applying).
        self.stalls: Counter[str] = Counter()
        self.bytes_in = 0
        self.bytes_out = 0
        # Per bucket: its operations and bytes, so that a test can count its
        # own bucket's requests alone (a request of another test still
        # retrying can reach a port reused by a new emulator).
        self.by_bucket: dict[str, dict[str, Any]] = {}
        self.throttled = 0
        self._cpu0 = time.process_time()
        self._t0 = time.monotonic()

    def count(
        self, op: str, status: int, bytes_in: int, bytes_out: int, bucket: str | None = None
    ) -> None:
        """Record one answered (or refused, or failed) request, on ``bucket`` if any."""
        self.begin(op, bucket)
        self.add_bytes(bytes_in, bytes_out, bucket)
        self.by_status[status] += 1

    def begin(self, op: str, bucket: str | None = None) -> None:
        """Record one request of ``op`` as it is admitted; its bytes and status come later.

        A gRPC stream is counted so, not when it ends: a client that has its
        answer may close the stream after it reads the counters.
        """
        self.requests += 1
        self.by_class[OP_CLASS.get(op, "other")] += 1
        self.by_op[op] += 1
        if bucket:
            self._bucket(bucket)["by_op"][op] += 1

    def add_bytes(self, bytes_in: int, bytes_out: int, bucket: str | None = None) -> None:
        """Record bytes received and sent, on ``bucket`` if any."""
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        if bucket:
            mine = self._bucket(bucket)
            mine["bytes_in"] += bytes_in
            mine["bytes_out"] += bytes_out

    def _bucket(self, bucket: str) -> dict[str, Any]:
        mine = self.by_bucket.get(bucket)
        if mine is None:
            mine = self.by_bucket[bucket] = {"by_op": Counter(), "bytes_in": 0, "bytes_out": 0}
        return mine

    def snapshot(self, backend_pid: int | None = None) -> dict[str, Any]:
        """The counters as a JSON-able dict.

        Args:
            backend_pid: The fake-gcs-server process, whose CPU is reported as
                ``backend_cpu_seconds`` when given.
        """
        cpu_total = time.process_time()
        out: dict[str, Any] = {
            "requests": self.requests,
            "by_class": {"A": 0, "B": 0, "free": 0, **self.by_class},
            "by_op": dict(self.by_op),
            "by_rpc": dict(self.by_rpc),
            "by_status": {str(k): v for k, v in self.by_status.items()},
            "faults": dict(self.faults),
            "stalls": dict(self.stalls),
            "throttled": self.throttled,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "by_bucket": {
                name: {**counts, "by_op": dict(counts["by_op"])}
                for name, counts in self.by_bucket.items()
            },
            "cpu_seconds": cpu_total - self._cpu0,
            "cpu_seconds_total": cpu_total,
            "wall_seconds": time.monotonic() - self._t0,
            "pid": os.getpid(),
        }
        if backend_pid is not None:
            out["backend_cpu_seconds_total"] = backend_cpu_seconds(backend_pid)
        return out


def backend_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` from /proc, or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # Fields after the command name: state is index 0, utime 11, stime 12.
    return (int(fields[11]) + int(fields[12])) / ticks
