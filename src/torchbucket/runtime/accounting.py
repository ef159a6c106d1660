"""Request accounting: what this process asked of its stores, by operation and class.

Every store counts each request it sends (the GCS backend at the one place it
sends a request, every attempt of a retried one included; the memory and local
stores once per operation, as GCS would be asked), classified as Google
classifies them for billing:

- class A: writes, listings, compose, copy/rewrite, patches, bucket creation and
  listing, and the XML multipart calls (initiate, part, complete, list);
- class B: object reads and metadata reads, bucket metadata, permission checks;
- free: deletes (of objects, buckets and multipart uploads).

Source: https://cloud.google.com/storage/pricing#operations-by-class (the JSON
and XML operations table; read 2026-12-01). The emulator's server-side counters
(``/_emulator/stats``) use the same operation names and classes, so the two can
be compared.

Besides requests: bytes received and sent (bodies), retries, hedges (the
second GET of a slow read, see ``torchbucket.config.HedgeConfig``; each is
also counted as the ``get`` it is, class B), throttled answers (429/503) and
the backoff slept after them.

Cost: plain integer increments on module state. The library's requests run on
one event loop per process (:mod:`torchbucket.runtime`), so there is no lock on
the hot path; a user who drives stores from several threads' loops at once may
lose an increment now and then (the GIL makes each ``+=`` a read and a write).
A forked child starts from zero: its counts are its own.

Reading::

    before = accounting.snapshot()
    ...
    spent = accounting.snapshot() - before

    with accounting.measure() as m:
        ...
    print(m.stats.class_a, m.stats.class_b)

Across DataLoader workers, datasets sum their workers' counts themselves (see
``BucketIterableDataset.last_epoch_stats``); across DDP ranks,
:func:`all_ranks` sums one snapshot per rank.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torchbucket._opclass import OP_CLASS, OPERATIONS
from torchbucket.runtime._classify import classify

__all__ = [
    "OPERATIONS",
    "OP_CLASS",
    "Measurement",
    "RequestStats",
    "all_ranks",
    "budget_status",
    "classify",
    "measure",
    "snapshot",
]


class _Counters:
    """This process's counters (one instance, module state)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "hedges",
        "ops",
        "read_around",
        "retries",
        "retry_wait_s",
        "throttle_wait_s",
        "throttled",
    )

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.retries = 0
        self.hedges = 0
        self.read_around = 0
        self.throttled = 0
        self.retry_wait_s = 0.0
        self.throttle_wait_s = 0.0


_c = _Counters()


# The requests sent in this context, by operation (see tally_requests).
_tally: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "torchbucket_request_tally", default=None
)


def count(op: str, bytes_out: int = 0) -> None:
    """Record one request of operation ``op`` sending ``bytes_out`` body bytes.

    Called before the request is sent (a request counted may not have left).
    """
    c = _c
    c.ops[op] = c.ops.get(op, 0) + 1
    if bytes_out:
        c.bytes_out += bytes_out
    tally = _tally.get()
    if tally is not None:
        tally[op] = tally.get(op, 0) + 1


@contextmanager
def tally_requests(tally: dict[str, int]) -> Iterator[dict[str, int]]:
    """Also count into ``tally`` the requests this context sends, by operation.

    For a caller that must know how many times one call sent its request
    (every try of its retries counted as it starts, before it is sent).
    """
    token = _tally.set(tally)
    try:
        yield tally
    finally:
        _tally.reset(token)


def received(n: int) -> None:
    """Record ``n`` body bytes received."""
    _c.bytes_in += n


def retried(wait: float, *, throttled: bool) -> None:
    """Record one retry after ``wait`` seconds of backoff (after a 429/503 if ``throttled``)."""
    c = _c
    c.retries += 1
    c.retry_wait_s += wait
    if throttled:
        c.throttle_wait_s += wait


def hedged() -> None:
    """Record one hedge: a second request sent for a slow read (its GET is counted apart)."""
    _c.hedges += 1


def read_around(n: int) -> None:
    """Record ``n`` objects of a composed group also read directly (their GETs are counted apart)."""
    _c.read_around += n


def throttle() -> None:
    """Record one throttled answer (429 or 503)."""
    _c.throttled += 1


def _reset() -> None:
    global _c
    _c = _Counters()


os.register_at_fork(after_in_child=_reset)


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestStats:
    """Counts of requests and bytes, as a snapshot or a difference of two.

    Attributes:
        by_op: Requests by operation (see :data:`OP_CLASS`); zero counts omitted.
        bytes_in: Body bytes received.
        bytes_out: Body bytes sent.
        retries: Attempts repeated after a failure.
        throttled: Answers that were 429 or 503.
        retry_wait_s: Seconds of backoff slept before retries.
        throttle_wait_s: The part of ``retry_wait_s`` after throttled answers.
        hedges: Second requests sent for slow reads (each also in ``by_op``
            as the ``get`` it is).
        read_around: Objects of composed groups also read directly because
            their compose path straggled (each read also in ``by_op`` as a
            ``get``): a second read of objects the composite also brings.
    """

    by_op: Mapping[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    retries: int = 0
    throttled: int = 0
    retry_wait_s: float = 0.0
    throttle_wait_s: float = 0.0
    hedges: int = 0
    read_around: int = 0

    def _by_class(self, cls: str) -> int:
        return sum(n for op, n in self.by_op.items() if OP_CLASS.get(op) == cls)

    @property
    def class_a(self) -> int:
        """Class A requests."""
        return self._by_class("A")

    @property
    def class_b(self) -> int:
        """Class B requests."""
        return self._by_class("B")

    @property
    def free(self) -> int:
        """Requests that are not billed (deletes)."""
        return self._by_class("free")

    @property
    def requests(self) -> int:
        """All requests."""
        return sum(self.by_op.values())

    def _combine(self, other: RequestStats, sign: int) -> RequestStats:
        ops = dict(self.by_op)
        for op, n in other.by_op.items():
            ops[op] = ops.get(op, 0) + sign * n
        return RequestStats(
            by_op={op: n for op, n in ops.items() if n},
            bytes_in=self.bytes_in + sign * other.bytes_in,
            bytes_out=self.bytes_out + sign * other.bytes_out,
            retries=self.retries + sign * other.retries,
            throttled=self.throttled + sign * other.throttled,
            retry_wait_s=self.retry_wait_s + sign * other.retry_wait_s,
            throttle_wait_s=self.throttle_wait_s + sign * other.throttle_wait_s,
            hedges=self.hedges + sign * other.hedges,
            read_around=self.read_around + sign * other.read_around,
        )

    def __add__(self, other: RequestStats) -> RequestStats:
        return self._combine(other, 1)

    def __sub__(self, other: RequestStats) -> RequestStats:
        return self._combine(other, -1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict, with the class totals."""
        return {
            "requests": self.requests,
            "by_class": {"A": self.class_a, "B": self.class_b, "free": self.free},
            "by_op": dict(sorted(self.by_op.items())),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "retries": self.retries,
            "throttled": self.throttled,
            "retry_wait_s": round(self.retry_wait_s, 6),
            "throttle_wait_s": round(self.throttle_wait_s, 6),
            "hedges": self.hedges,
            "read_around": self.read_around,
        }

    def to_vector(self) -> list[float]:
        """The counts in a fixed order (:data:`OPERATIONS`, then the rest)."""
        return [
            *(float(self.by_op.get(op, 0)) for op in OPERATIONS),
            float(self.bytes_in),
            float(self.bytes_out),
            float(self.retries),
            float(self.throttled),
            self.retry_wait_s,
            self.throttle_wait_s,
            float(self.hedges),
            float(self.read_around),
        ]

    @classmethod
    def from_vector(cls, values: Any) -> RequestStats:
        """The inverse of :meth:`to_vector` (any sequence of numbers)."""
        v = [float(x) for x in values]
        n = len(OPERATIONS)
        return cls(
            by_op={op: round(v[i]) for i, op in enumerate(OPERATIONS) if round(v[i])},
            bytes_in=round(v[n]),
            bytes_out=round(v[n + 1]),
            retries=round(v[n + 2]),
            throttled=round(v[n + 3]),
            retry_wait_s=v[n + 4],
            throttle_wait_s=v[n + 5],
            hedges=round(v[n + 6]),
            read_around=round(v[n + 7]),
        )

    def summary(self) -> str:
        """One line: requests by class, bytes, retries and throttling."""
        line = (
            f"requests: {self.requests} (class A {self.class_a}, class B {self.class_b}, "
            f"free {self.free}); {self.bytes_in:,} bytes in, {self.bytes_out:,} out; "
            f"{self.retries} retries"
        )
        if self.hedges:
            line += f", {self.hedges} hedged"
        if self.read_around:
            line += f", {self.read_around} objects read around a slow compose"
        if self.throttled:
            line += f", {self.throttled} throttled ({self.throttle_wait_s:.2f} s waited)"
        return line


#: Length of :meth:`RequestStats.to_vector`.
VECTOR_LEN = len(OPERATIONS) + 8


def budget_status() -> dict[str, dict[str, Any]]:
    """This rank's job-wide request budgets by bucket (empty when off): mode, its and the
    job's rate and throttle counts per class (:meth:`torchbucket.runtime.budget.Budget.status`)."""
    from torchbucket.runtime import budget

    return budget.status()


def snapshot() -> RequestStats:
    """This process's counts since it started (or was forked)."""
    c = _c
    return RequestStats(
        by_op={op: n for op, n in c.ops.items() if n},
        bytes_in=c.bytes_in,
        bytes_out=c.bytes_out,
        retries=c.retries,
        throttled=c.throttled,
        retry_wait_s=c.retry_wait_s,
        throttle_wait_s=c.throttle_wait_s,
        hedges=c.hedges,
        read_around=c.read_around,
    )


class Measurement:
    """What :func:`measure` yields; ``stats`` is final when the block ends."""

    def __init__(self) -> None:
        self._start = snapshot()
        self._stats: RequestStats | None = None

    @property
    def stats(self) -> RequestStats:
        """The counts of the block (so far, while it runs)."""
        return self._stats if self._stats is not None else snapshot() - self._start

    def _finish(self) -> None:
        self._stats = snapshot() - self._start


@contextmanager
def measure() -> Iterator[Measurement]:
    """The requests this process made during a ``with`` block (all its threads).

    Example::

        with torchbucket.accounting.measure() as m:
            store.list_all()
        print(m.stats.summary())
    """
    m = Measurement()
    try:
        yield m
    finally:
        m._finish()


def all_ranks(stats: RequestStats, group: Any = None) -> RequestStats:
    """``stats`` summed over the ranks of ``torch.distributed`` (a collective).

    Every rank must call it. Without an initialised process group it returns
    ``stats`` unchanged.

    Args:
        stats: This rank's counts (a snapshot or a difference).
        group: The process group; default the world.
    """
    try:
        import torch
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return stats
    if not (dist.is_available() and dist.is_initialized()):
        return stats
    device = "cpu"
    if dist.get_backend(group) == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    tensor = torch.tensor(stats.to_vector(), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, group=group)
    return RequestStats.from_vector(tensor.cpu().tolist())
