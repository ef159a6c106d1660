"""What every contender script shares (stdlib and google_crc32c: it runs in every venv).

A contender is a small script that ``benchmarks/_harness.run_contender`` starts
in its own process, so that its CPU time and memory are its own. It gets one
JSON argument (its spec), does its setup (imports, clients, listing), then
measures one phase inside :class:`Phase` and prints, as its last stdout line,
``CONTENDER {json}`` with what it measured::

    spec = load_spec()
    ...setup...
    with Phase(spec["endpoint"]) as phase:
        ...fetch, verify...
    emit({**phase.result(), "objects": n})

:class:`Phase` resets the emulator's counters when the phase begins, so the
server's requests and CPU it reports belong to the phase alone (what setup
cost, a listing for example, is reported apart as ``setup_server``). Its CPU
figure is ``getrusage`` of this process plus every child it has reaped
(DataLoader workers are joined when an epoch's iterator is exhausted), so
imports and interpreter start-up are left out.

Object contents follow ``torchbucket.emulator.generated_bytes``: the 32-byte
BLAKE2b digest of ``"{seed}:{name}"`` repeated to the object's size. The first
32 bytes name the object; :class:`Verifier` checks that each expected object
arrives exactly once and that every byte of its body is right, through the
body's CRC32C (``google_crc32c``, in every benchmark venv) against the CRC32C of
the object's expected contents, computed at setup. The check reads each body
once, in place (no copy for any contender, a tensor through ``.numpy()``), at
about 0.4 ms per 4 MiB: the same small cost for every contender, where the
byte comparison it replaces (building the expected bytes, comparing; a tensor
copied to ``bytes`` first) took ~5 ms per 4 MiB of the consumer's CPU. CRC32C
detects every error burst up to 32 bits and any other corruption but with
probability 2**-32.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import google_crc32c

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def load_spec() -> dict[str, Any]:
    """The contender's spec: the JSON document in ``sys.argv[1]`` (``@path``: in a file)."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} '<json spec>' | @spec.json")
    arg = sys.argv[1]
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            arg = f.read()
    spec: dict[str, Any] = json.loads(arg)
    return spec


def generated_names(prefix: str, count: int) -> list[str]:
    """The names ``seed_generated`` gives (``"sequential"``): prefix + padded index."""
    width = max(8, len(str(max(count - 1, 0))))
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def spec_objects(spec: Mapping[str, Any]) -> tuple[list[str], Verifier]:
    """The objects a spec names, and the verifier of their bytes.

    ``sizes`` (name -> size, objects of many sizes: ``benchmarks/varied_sizes.py``)
    where the spec has it; otherwise ``count`` generated names under ``prefix``,
    all of ``size`` bytes.
    """
    seed = int(spec.get("seed", 0))
    sizes: Mapping[str, int] | None = spec.get("sizes")
    if sizes:
        names = list(sizes)
        return names, Verifier(names, 0, seed, sizes=sizes)
    names = generated_names(spec["prefix"], spec["count"])
    return names, Verifier(names, spec["size"], seed)


def emit(payload: dict[str, Any]) -> None:
    """Print the contender's result line (must be the last line on stdout)."""
    sys.stdout.write("CONTENDER " + json.dumps(payload, sort_keys=True) + "\n")
    sys.stdout.flush()


def digest_of(name: str, seed: int = 0) -> bytes:
    """The 32-byte digest a generated object's contents repeat."""
    return hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=32).digest()


def expected_bytes(name: str, size: int, seed: int = 0) -> bytes:
    """The contents of a generated object (as ``generated_bytes``)."""
    digest = digest_of(name, seed)
    return (digest * (size // 32 + 1))[:size]


def object_url(endpoint: str, bucket: str, name: str) -> str:
    """The JSON API media URL of one object."""
    b = urllib.parse.quote(bucket, safe="")
    n = urllib.parse.quote(name, safe="")
    return f"{endpoint}/storage/v1/b/{b}/o/{n}?alt=media"


def crc32c(data: Any) -> int:
    """CRC32C of a body, read in place.

    ``google_crc32c`` takes ``bytes`` and numpy arrays but not a ``memoryview``
    or ``bytearray``: those are viewed as a numpy array (no copy).
    """
    if not isinstance(data, bytes) and type(data).__module__ != "numpy":
        import numpy as np  # in every benchmark venv; only bodies that are not bytes need it

        data = np.frombuffer(data, dtype=np.uint8)
    return int(google_crc32c.value(data))


#: A directory where the expected CRC32Cs of each dataset are kept for the
#: next run of the same benchmark (``_harness.run_contender`` makes one per
#: benchmark process and removes it at exit): computing them reads every
#: expected byte, about 3 s of one core for the 2 GiB of a large-sample run.
CRC_CACHE_ENV = "TORCHBUCKET_BENCH_CRC_CACHE"


def expected_crcs(
    names: list[str], size: int, seed: int = 0, sizes: Mapping[str, int] | None = None
) -> list[int]:
    """The CRC32C of each generated object's contents, from the cache when it has them.

    ``sizes``: each name's size, where they differ (``size`` is then unused).
    """
    lengths = [size] * len(names) if sizes is None else [sizes[n] for n in names]
    directory = os.environ.get(CRC_CACHE_ENV)
    path = None
    if directory:
        dataset = [size, seed, names] if sizes is None else [lengths, seed, names]
        key = hashlib.blake2b(json.dumps(dataset).encode(), digest_size=16)
        path = os.path.join(directory, f"{key.hexdigest()}.json")
        try:
            with open(path) as f:
                cached = json.load(f)
            if isinstance(cached, list) and len(cached) == len(names):
                return [int(c) for c in cached]
        except (OSError, ValueError):
            pass  # not there yet (or unreadable): computed below
    crcs = [crc32c(expected_bytes(n, length, seed)) for n, length in zip(names, lengths)]
    if path is not None:
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as f:
            json.dump(crcs, f)
        os.replace(partial, path)
    return crcs


class VerifyError(AssertionError):
    """A body that is not the bytes of the object it claims to be."""


class Verifier:
    """Checks every byte of generated objects (by CRC32C) and that each arrives once.

    The expected CRC32C of every object is computed here, before a contender's
    measured phase.

    Args:
        names: The objects expected.
        size: Their size in bytes.
        seed: The generator seed.
        sizes: Each name's size, where they differ (``size`` is then unused).
    """

    def __init__(
        self,
        names: Iterable[str],
        size: int,
        seed: int = 0,
        *,
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.size = size
        names = list(names)
        crcs = expected_crcs(names, size, seed, sizes)
        # Each object's name, CRC32C and size, by the digest its contents repeat.
        self._by_digest: dict[bytes, tuple[str, int, int]] = {
            digest_of(n, seed): (n, crc, size if sizes is None else sizes[n])
            for n, crc in zip(names, crcs, strict=True)
        }
        self._seen: set[str] = set()
        self.bytes = 0

    def check(self, data: Any, name: str | None = None) -> str:
        """Check one body; return the object's name.

        Args:
            data: The body: ``bytes`` or any buffer (``bytearray``,
                ``memoryview``, a numpy array; a tensor's ``.numpy()``).
            name: The name the body was fetched as, when the caller knows it.

        Raises:
            VerifyError: Wrong size, unknown or duplicate object, wrong bytes.
        """
        found, crc, size = self._by_digest.get(bytes(data[:32]), (None, 0, 0))
        if found is None or (name is not None and found != name):
            raise VerifyError(f"{name or '?'}: contents of another or no object ({found})")
        if len(data) != size:
            raise VerifyError(f"{found}: {len(data)} bytes, expected {size}")
        if crc32c(data) != crc:
            raise VerifyError(f"{found}: corrupted bytes (CRC32C differs)")
        if found in self._seen:
            raise VerifyError(f"{found}: delivered twice")
        self._seen.add(found)
        self.bytes += size
        return found

    def finish(self) -> int:
        """Check that every expected object arrived; return how many did.

        Raises:
            VerifyError: Some never arrived.
        """
        missing = len(self._by_digest) - len(self._seen)
        if missing:
            raise VerifyError(f"{missing} of {len(self._by_digest)} objects never arrived")
        return len(self._seen)


def _admin(endpoint: str, method: str, path: str) -> Any:
    data = b"{}" if method == "POST" else None
    req = urllib.request.Request(f"{endpoint}/_emulator/{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with _OPENER.open(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")


def server_stats(endpoint: str) -> dict[str, Any]:
    """The emulator's counters since the last reset, summarised.

    Returns:
        ``requests``, ``class_a``, ``class_b``, ``by_op``, ``by_status``,
        ``stalls`` (the latency model's stalls, ``"<op>:before"`` or
        ``":after"`` the request was applied) and ``cpu_s`` (the server's CPU
        seconds).
    """
    s = _admin(endpoint, "GET", "stats")
    by_class = s.get("by_class", {})
    return {
        "requests": int(s.get("requests", 0)),
        "class_a": int(by_class.get("A", 0)),
        "class_b": int(by_class.get("B", 0)),
        "by_op": dict(s.get("by_op", {})),
        "by_status": dict(s.get("by_status", {})),
        "stalls": dict(s.get("stalls", {})),
        "cpu_s": float(s.get("cpu_seconds", 0.0)),
    }


def reset_server_stats(endpoint: str) -> None:
    """Zero the emulator's counters and CPU clock."""
    _admin(endpoint, "POST", "stats/reset")


def _cpu() -> tuple[float, float, float]:
    """User and system CPU of this process and its reaped children, and the children's share."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (
        me.ru_utime + kids.ru_utime,
        me.ru_stime + kids.ru_stime,
        kids.ru_utime + kids.ru_stime,
    )


class Phase:
    """The measured part of a contender's run.

    Args:
        endpoint: The emulator, whose counters are reset on entry and read on
            exit; ``None`` to leave the server alone.
    """

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = endpoint
        self.setup_server: dict[str, Any] | None = None
        self.server: dict[str, Any] | None = None
        self.wall_s = 0.0
        self.cpu_user_s = 0.0
        self.cpu_sys_s = 0.0
        self.cpu_children_s = 0.0
        self._t0 = 0.0
        self._c0 = (0.0, 0.0, 0.0)

    def __enter__(self) -> Phase:
        if self.endpoint is not None:
            self.setup_server = server_stats(self.endpoint)
            reset_server_stats(self.endpoint)
        self._c0 = _cpu()
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.wall_s = time.perf_counter() - self._t0
        user, system, children = _cpu()
        self.cpu_user_s = user - self._c0[0]
        self.cpu_sys_s = system - self._c0[1]
        self.cpu_children_s = children - self._c0[2]
        if exc_type is None and self.endpoint is not None:
            self.server = server_stats(self.endpoint)

    def result(self) -> dict[str, Any]:
        """The phase's figures as a JSON-able dict."""
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_user_s + self.cpu_sys_s,
            "cpu_user_s": self.cpu_user_s,
            "cpu_sys_s": self.cpu_sys_s,
            "cpu_children_s": self.cpu_children_s,
            "server": self.server,
            "setup_server": self.setup_server,
        }


# --------------------------------------------------------------- DataLoader


def identity_collate(batch: list[Any]) -> list[Any]:
    """A batch as the list of its samples (every loader contender uses it)."""
    return batch


class WorkerPids:
    """Collects DataLoader workers' pids through a file (``worker_init_fn``).

    Args:
        path: A file the workers append their pid to; ``None`` to collect none.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        if path:
            open(path, "w").close()

    def __call__(self, worker_id: int) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{os.getpid()}\n")

    def pids(self) -> list[int]:
        """The pids recorded so far."""
        if not self.path or not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [int(line) for line in f if line.strip()]


class BatchTimes:
    """Times each ``__getitems__`` call in the DataLoader workers, through a file.

    A map-style dataset's ``__getitems__`` fetches one batch: with a plain
    sampler the call lasts from the batch's first request to its slowest
    answer, the time a straggler holds the batch (issue 19); with a dataset
    that reads ahead it is the worker's wait for reads begun earlier. A
    dataset without ``__getitems__`` is left as it is (nothing recorded).

    Args:
        path: A file the workers append each call's seconds to; ``None`` to
            record nothing.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        if path:
            open(path, "w").close()

    def wrap(self, dataset: Any) -> None:
        """Time ``dataset.__getitems__`` (an instance attribute, which the
        DataLoader's fetcher looks up as any attribute; forked workers inherit it)."""
        original = getattr(dataset, "__getitems__", None)
        if not self.path or original is None:
            return
        path = self.path
        started: set[int] = set()  # pids whose first call (start-up) has passed

        def timed(indices: Any) -> Any:
            t0 = time.perf_counter()
            items = original(indices)
            # A worker's first batch also opens its session and connections:
            # left out, as run_epoch leaves out the first batch.
            pid = os.getpid()
            if pid in started:
                line = f"{time.perf_counter() - t0:.6f}\n".encode()
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, line)  # one short O_APPEND write: whole lines
                finally:
                    os.close(fd)
            started.add(pid)
            return items

        dataset.__getitems__ = timed

    def quantiles(self) -> dict[str, float]:
        """``fetch_s_p50`` / ``fetch_s_p99`` of the calls, or nothing when none."""
        if not self.path or not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            times = sorted(float(line) for line in f if line.strip())
        if not times:
            return {}
        return {
            "fetch_s_p50": times[len(times) // 2],
            "fetch_s_p99": times[min(len(times) - 1, int(0.99 * len(times)))],
            "fetch_calls": len(times),
        }


def run_epoch(
    loader: Iterable[Any], verifier: Verifier, *, names_known: bool = False
) -> dict[str, Any]:
    """Iterate one epoch of ``loader``, checking every sample.

    Samples are bodies, or ``(name, body)`` pairs when ``names_known``.

    Returns:
        ``batches``; ``first_batch_s`` (from the call to the first batch:
        worker start-up and the first round trips); ``steady_samples_per_s``
        (samples after the first batch over the time from the first batch to
        the last); ``batch_s_p50`` / ``batch_s_p99``: quantiles of the time
        between two batches after the first (the consumer's check included);
        ``wait_s_p50`` / ``wait_s_p99`` / ``wait_s_mean``: of the time the
        consumer waited for each batch after the first, from asking for it to
        having it (what a training step feels: a batch read ahead takes
        microseconds, so its median is near zero and a ratio to it means little);
        ``check_cpu_s``: the CPU the consumer's checks took (part of the
        phase's client CPU).
    """
    gaps: list[float] = []
    waits: list[float] = []
    batches = 0
    t0 = time.perf_counter()
    t_first = t_last = t_ask = t0
    first_len = 0
    total = 0
    check_cpu = 0.0
    for batch in loader:
        now = time.perf_counter()
        if batches:
            gaps.append(now - t_last)
            waits.append(now - t_ask)
        t_last = now
        if batches == 0:
            t_first = t_last
            first_len = len(batch)
        batches += 1
        total += len(batch)
        c0 = time.process_time()
        for sample in batch:
            if names_known:
                verifier.check(sample[1], sample[0])
            elif hasattr(sample, "numpy"):
                # A uint8 tensor (FetchConfig(output="tensor")): checked in place.
                verifier.check(sample.numpy())
            else:
                verifier.check(sample)
        check_cpu += time.process_time() - c0
        t_ask = time.perf_counter()
    span = t_last - t_first
    gaps.sort()
    mean_wait = sum(waits) / len(waits) if waits else None
    waits.sort()
    return {
        "batch_s_p50": gaps[len(gaps) // 2] if gaps else None,
        "batch_s_p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else None,
        "batches": batches,
        "check_cpu_s": check_cpu,
        "first_batch_s": t_first - t0,
        "steady_samples_per_s": (total - first_len) / span if span > 0 else None,
        "wait_s_mean": mean_wait,
        "wait_s_p50": waits[len(waits) // 2] if waits else None,
        "wait_s_p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else None,
    }


def measure_loader(
    spec: dict[str, Any],
    dataset: Any,
    verifier: Verifier,
    *,
    names_known: bool = False,
    loader_kwargs: dict[str, Any] | None = None,
    **extra: Any,
) -> None:
    """Read one epoch of ``dataset`` through the spec's DataLoader, measured, and emit it.

    Every loader contender ends with this, so all of them are timed, checked and
    reported the same way; ``loader_kwargs`` adds DataLoader arguments (a
    ``batch_sampler`` replaces the spec's ``batch_size``); ``extra`` adds
    contender-specific fields.
    """
    from torch.utils.data import DataLoader  # only the loader contenders need torch

    kwargs: dict[str, Any] = {"batch_size": spec["batch_size"], **(loader_kwargs or {})}
    if "batch_sampler" in kwargs:
        del kwargs["batch_size"]
    pids = WorkerPids(spec.get("pid_file"))
    # spec "collate": "torch" is a user's plain DataLoader: nothing between
    # torch's fetcher and the dataset, so no __getitems__ timer either (a
    # dataset wrapped by anything keeps its raw samples' bytes in the worker:
    # datasets/_handover.py).
    plain = spec.get("collate") == "torch"
    batch_times = BatchTimes(
        f"{spec['pid_file']}.batches" if spec.get("pid_file") and not plain else None
    )
    batch_times.wrap(dataset)
    with Phase(spec["endpoint"]) as phase:
        loader = DataLoader(
            dataset,
            num_workers=spec["num_workers"],
            # spec "collate": "torch": the DataLoader's own (default_collate),
            # what a user who passes none gets; else the batch as its list.
            collate_fn=None if plain else identity_collate,
            worker_init_fn=pids,
            **kwargs,
        )
        epoch = run_epoch(loader, verifier, names_known=names_known)
        del loader
    # The library's own counts, workers summed (torchbucket's datasets only):
    # hedges are second GETs of slow reads, also among the gets, and so are
    # the reads of objects read around a straggling compose.
    stats = getattr(dataset, "last_epoch_stats", None)
    if stats is not None:
        epoch.update(
            client_gets=stats.by_op.get("get", 0),
            hedges=stats.hedges,
            read_around=stats.read_around,
        )
    emit(
        {
            **phase.result(),
            "objects": verifier.finish(),
            "bytes": verifier.bytes,
            **epoch,
            **batch_times.quantiles(),
            "worker_pids": pids.pids(),
            **extra,
        }
    )
