"""Shared by the checkpoint contender scripts (``ckpt_*.py``, ``dcp_*.py``).

Runs under the project's ``.venv`` and under the benchmark environment
(``.venv-bench``, where torchbucket is not installed), so it imports nothing
from torchbucket. Each contender script is one process started by
``_harness.run_contender`` with a JSON spec (``op`` "save" or "load",
``endpoint``, ``bucket``, ``name``, ``size``, ``seed``, ``ranks``, ``digest``):
it builds the state dict (or, to load into, its zero-filled twin for DCP),
measures one save or one load inside ``_common.Phase`` with a 5 ms peak-RSS
sampling thread of its own (the RSS just before the operation is the baseline),
and prints ``CONTENDER {json}``. Loads report per-tensor SHA-1 digests, which
the benchmark compares with those of the originals.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import psutil
import torch
from _common import Phase, emit, load_spec, reset_server_stats, server_stats

MiB = 1 << 20

# Fractions of the checkpoint in large fp32, medium bf16 and small tensors.
_LARGE_FRACTION = 0.70
_MEDIUM_FRACTION = 0.20
_LARGE_COUNT = 4
_MEDIUM_COUNT = 16
# Small tensors cycle through these sizes (bytes): biases, norms, embeddings.
_SMALL_SIZES = (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10)


def tensor_plan(total_bytes: int) -> list[tuple[str, torch.dtype, int]]:
    """Names, dtypes and element counts of a state dict of about ``total_bytes``.

    A few large fp32 tensors (70%), some bf16 ones (20%) and many small fp32 /
    int64 ones (10%: about 1,500 tensors per GiB).
    """
    plan: list[tuple[str, torch.dtype, int]] = []
    large = int(total_bytes * _LARGE_FRACTION) // _LARGE_COUNT // 4
    for i in range(_LARGE_COUNT):
        plan.append((f"embed.{i}.weight", torch.float32, large))
    medium = int(total_bytes * _MEDIUM_FRACTION) // _MEDIUM_COUNT // 2
    for i in range(_MEDIUM_COUNT):
        plan.append((f"blocks.{i}.mlp.weight", torch.bfloat16, medium))
    left = total_bytes - _LARGE_COUNT * large * 4 - _MEDIUM_COUNT * medium * 2
    n = 0
    while left > 0:
        size = min(_SMALL_SIZES[n % len(_SMALL_SIZES)], left)
        dtype = torch.int64 if n % 7 == 3 else torch.float32
        numel = max(1, size // dtype.itemsize)
        plan.append((f"blocks.{n // 5}.small.{n % 5}", dtype, numel))
        left -= numel * dtype.itemsize
        n += 1
    return plan


def make_tensor(name: str, dtype: torch.dtype, numel: int, seed: int) -> torch.Tensor:
    """A deterministic tensor: the same name, dtype, size and seed give the same bytes."""
    g = torch.Generator().manual_seed(seed ^ (int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)))
    if dtype == torch.int64:
        return torch.randint(0, 1 << 40, (numel,), generator=g, dtype=torch.int64)
    return torch.empty(numel, dtype=dtype).uniform_(-1.0, 1.0, generator=g)


def make_state_dict(total_bytes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The benchmark's state dict of about ``total_bytes`` (see :func:`tensor_plan`)."""
    return {name: make_tensor(name, dt, n, seed) for name, dt, n in tensor_plan(total_bytes)}


def nbytes(state_dict: dict[str, Any]) -> int:
    """Bytes of tensor data in ``state_dict``."""
    return sum(t.numel() * t.element_size() for t in state_dict.values())


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-1 of a tensor's dtype, shape and bytes."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha1(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.view(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def digests(state_dict: dict[str, Any]) -> dict[str, str]:
    """Per-tensor digests of ``state_dict`` (DTensors digest their local shard)."""
    out = {}
    for name, value in state_dict.items():
        local = value.to_local() if hasattr(value, "to_local") else value
        out[name] = tensor_digest(local)
    return out


def rss() -> int:
    """This process's resident set size, bytes."""
    return int(psutil.Process().memory_info().rss)


class PeakRSS:
    """Samples this process's RSS every ``interval`` seconds in a thread.

    ``baseline`` is the RSS when the block starts, ``peak`` the largest sample
    (at least the RSS at the end of the block).
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, int(self._proc.memory_info().rss))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.baseline = rss()
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = max(self.peak, rss())
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


@contextmanager
def measured(result: dict[str, Any], endpoint: str | None) -> Iterator[None]:
    """Time a block (``_common.Phase``: wall, CPU, server) and its RSS into ``result``."""
    with PeakRSS() as mem:
        with Phase(endpoint) as phase:
            yield
        result.update(phase.result())
    result["rss_baseline"] = mem.baseline
    result["rss_peak"] = mem.peak
    result["rss_extra"] = mem.peak - mem.baseline


def gcs_client(endpoint: str) -> Any:
    """An anonymous ``google.cloud.storage.Client`` for the emulator at ``endpoint``."""
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


def spec_args() -> SimpleNamespace:
    """The contender's spec (``_common.load_spec``) with defaults, as attributes."""
    spec = {"seed": 0, "ranks": 2, "digest": False, **load_spec()}
    for key in ("op", "endpoint", "bucket", "name", "size"):
        if key not in spec:
            raise SystemExit(f"spec lacks {key!r}")
    if spec["op"] not in ("save", "load"):
        raise SystemExit(f"op must be save or load, got {spec['op']!r}")
    return SimpleNamespace(**spec)


def main_single(prepare: Any, save: Any, load: Any) -> None:
    """Run one save or load of a single-file checkpoint contender.

    Args:
        prepare: ``prepare(args) -> handle``: clients and a first request to the
            bucket (a warm client, as in a training job that saves every N
            steps); not timed.
        save: ``save(handle, args, state_dict)``: the timed save.
        load: ``load(handle, args) -> state_dict``: the timed load.
    """
    import resource

    args = spec_args()
    handle = prepare(args)
    result: dict[str, Any] = {"op": args.op, "pid": os.getpid()}
    if args.op == "save":
        state_dict = make_state_dict(args.size, args.seed)
        result["nbytes"] = nbytes(state_dict)
        if args.digest:
            result["digests"] = digests(state_dict)
        with measured(result, args.endpoint):
            save(handle, args, state_dict)
    else:
        with measured(result, args.endpoint):
            state_dict = load(handle, args)
        result["nbytes"] = nbytes(state_dict)
        result["digests"] = digests(state_dict)
    result["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    emit(result)


# -- DCP: 2 ranks (gloo on CPU), large tensors sharded, small ones replicated --


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_dcp_state_dict(
    total_bytes: int, seed: int, rank: int, world: int, *, zeros: bool
) -> dict[str, Any]:
    """This rank's part of a DCP state dict of about ``total_bytes`` in all.

    The large and medium tensors of :func:`tensor_plan` are DTensors sharded on
    dim 0 over the ranks (each rank's shard its own bytes); the small ones are
    plain tensors, the same on every rank (DCP writes them once). With
    ``zeros``, the same structure filled with zeros, to load into.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    out: dict[str, Any] = {}
    for name, dtype, numel in tensor_plan(total_bytes):
        if numel >= MiB:
            local_numel = numel // world
            if zeros:
                local = torch.zeros(local_numel, dtype=dtype)
            else:
                local = make_tensor(f"{name}#{rank}", dtype, local_numel, seed)
            out[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        else:
            out[name] = (
                torch.zeros(numel, dtype=dtype) if zeros else make_tensor(name, dtype, numel, seed)
            )
    return out


def _write_json(path: str, result: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def _dcp_rank(rank: int, args: SimpleNamespace, port: int, out: str, storage: Any) -> None:
    import resource

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks
    )
    try:
        state_dict = make_dcp_state_dict(
            args.size, args.seed, rank, args.ranks, zeros=args.op == "load"
        )
        result: dict[str, Any] = {"op": args.op, "rank": rank, "pid": os.getpid()}
        result["local_nbytes"] = sum(
            (v.to_local() if hasattr(v, "to_local") else v).nbytes for v in state_dict.values()
        )
        if args.op == "save" and args.digest:
            result["digests"] = digests(state_dict)
        location = storage.location(args)
        handle = storage.prepare(args)
        if rank == 0:
            reset_server_stats(args.endpoint)
        dist.barrier()
        # Phase(None): rank 0 reads the server's counters after every rank is done.
        with measured(result, None):
            if args.op == "save":
                dcp.save(state_dict, storage_writer=storage.writer(handle, location))
            else:
                dcp.load(state_dict, storage_reader=storage.reader(handle, location))
        dist.barrier()
        if rank == 0:
            result["server"] = server_stats(args.endpoint)
        if args.op == "load":
            result["digests"] = digests(state_dict)
        result["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        _write_json(f"{out}.rank{rank}", result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main_dcp(storage: Any) -> None:
    """Run one DCP save or load on ``ranks`` spawned processes (gloo).

    Args:
        storage: A module-level object with ``location(args)``, ``prepare(args)``
            (not timed), ``writer(handle, location)`` and ``reader(handle, location)``.
    """
    import tempfile

    import torch.multiprocessing as mp

    args = spec_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-dcp-") as tmp:
        out = os.path.join(tmp, "result")
        mp.start_processes(
            _dcp_rank,
            args=(args, _free_port(), out, storage),
            nprocs=args.ranks,
            start_method="spawn",
        )
        ranks = []
        for rank in range(args.ranks):
            with open(f"{out}.rank{rank}") as f:
                ranks.append(json.load(f))
    merged: dict[str, Any] = {
        "op": args.op,
        "ranks": args.ranks,
        # dcp.save/load end with a collective: the slowest rank is the time.
        "wall_s": max(r["wall_s"] for r in ranks),
        "cpu_s": sum(r["cpu_s"] for r in ranks),
        "server": ranks[0]["server"],
        "rss_baseline": max(r["rss_baseline"] for r in ranks),
        "rss_peak": max(r["rss_peak"] for r in ranks),
        "rss_extra": max(r["rss_extra"] for r in ranks),
        "local_nbytes": [r["local_nbytes"] for r in ranks],
        "per_rank": [{k: v for k, v in r.items() if k != "digests"} for r in ranks],
    }
    if any("digests" in r for r in ranks):
        merged["digests"] = {str(r["rank"]): r.get("digests") for r in ranks}
    emit(merged)
