"""Shared helpers for every benchmark under ``benchmarks/``.

A benchmark starts the emulator's model store, seeds it, runs each contender
in its own subprocess (so the CPU and memory measured are the contender's
alone), takes medians over repeats, prints a table, writes
``bench-output/<name>.json`` and a PNG, and prints ``RESULT {json}`` last::

    import _harness as h

    with h.emulator(latency="same-region") as emu:
        names = h.seed(emu, "bench", count=3000, size=10 << 10, prefix="t/")
        runs = h.repeat(3, lambda: h.run_contender(
            "aiohttp", "aiohttp_loop.py", {"endpoint": emu.endpoint, ...}))
        med = h.medians(runs)            # {"wall_s": ..., "data.cpu_s": ..., ...}
    h.print_table("title", rows, [("name", "contender", "s"), ("rate", "obj/s", ".0f")])
    h.write_json("transport", {...})     # adds the machine description
    h.bar_chart("transport", [h.Panel("CPU us/object", labels, values)])
    h.emit_result({...})

API (kept stable; other benchmarks import it):

- ``ROOT``, ``OUTPUT_DIR`` (``bench-output/``, or ``$TORCHBUCKET_BENCH_OUTPUT``),
  ``CONTENDERS_DIR``: paths.
- ``bench_python()``: the contenders' interpreter (``.venv-bench``, or
  ``$TORCHBUCKET_BENCH_PYTHON``), ``None`` when missing.
- ``emulator(latency=..., **kwargs)``: a started ``Emulator`` (model store).
- ``seed(emu, bucket, *, count, size, prefix, seed=0)``: server-generated
  objects (``generated_bytes``), returns their names.
- ``run_contender(name, script, spec, *, python=None, env=None, timeout=...,
  zygotes=None)``: runs ``_contenders/<script>`` (or any path) with ``spec`` as
  its JSON argument, in a fresh process or forked from a zygote
  (``_zygote.py``), and returns a :class:`ContenderRun`; see
  ``_contenders/_common.py`` for the contender side (``Phase``, ``Verifier``,
  ``emit``).
- ``repeat(n, fn)``, ``median(values)``, ``medians(runs)``, ``median_figures(runs)``,
  ``ratio(a, b)``.
- ``add_latency_option(parser)`` / ``latency_presets(parser, args)``: the
  ``--latency`` option of the benchmarks that run under each preset in turn.
- ``machine_info()``, ``print_table(...)``, ``write_json(name, payload)``, ``rel(path)``,
  ``bar_chart(name, panels)``, ``emit_result(payload)``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from _contenders._common import CRC_CACHE_ENV
from _zygote import Zygote, Zygotes

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
CONTENDERS_DIR = BENCH_DIR / "_contenders"
# $TORCHBUCKET_BENCH_OUTPUT moves every output (a smoke test writes to a temporary folder).
OUTPUT_DIR = Path(os.environ.get("TORCHBUCKET_BENCH_OUTPUT") or ROOT / "bench-output")
LOG_DIR = OUTPUT_DIR / "logs"
DEFAULT_BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
DEFAULT_FSSPEC_PYTHON = ROOT / ".venv-gcsfs" / "bin" / "python"

T = TypeVar("T")

__all__ = [
    "CONTENDERS_DIR",
    "OUTPUT_DIR",
    "ROOT",
    "ContenderError",
    "ContenderRun",
    "Panel",
    "bar_chart",
    "bench_python",
    "emit_result",
    "emulator",
    "fsspec_python",
    "machine_info",
    "median",
    "medians",
    "package_versions",
    "print_table",
    "ratio",
    "rel",
    "repeat",
    "run_contender",
    "seed",
    "write_json",
]


# --------------------------------------------------------------- environment


def bench_python() -> str | None:
    """The interpreter of the contenders' environment (google-cloud-storage, dataflux).

    ``$TORCHBUCKET_BENCH_PYTHON`` wins; else ``.venv-bench/bin/python`` at the
    repository root (``benchmarks/setup_bench_env.sh`` creates it). ``None``
    when neither exists: benchmarks then skip those contenders and say so.
    """
    env = os.environ.get("TORCHBUCKET_BENCH_PYTHON")
    if env:
        return env if os.path.exists(env) else None
    return str(DEFAULT_BENCH_PYTHON) if DEFAULT_BENCH_PYTHON.exists() else None


def fsspec_python() -> str | None:
    """The interpreter of the fsspec contenders' environment (gcsfs, webdataset).

    A separate environment from :func:`bench_python`'s: gcsfs 2026.x requires
    google-cloud-storage>=3.14.1 (it imports ``google.cloud.storage.asyncio`` on
    import), gcs-torch-dataflux 1.4.0's checkpoint module <3.
    ``$TORCHBUCKET_FSSPEC_PYTHON`` wins; else ``.venv-gcsfs/bin/python``
    (``benchmarks/setup_bench_env.sh`` creates it); ``None`` when neither exists.
    """
    env = os.environ.get("TORCHBUCKET_FSSPEC_PYTHON")
    if env:
        return env if os.path.exists(env) else None
    return str(DEFAULT_FSSPEC_PYTHON) if DEFAULT_FSSPEC_PYTHON.exists() else None


def package_versions(python: str | None, packages: tuple[str, ...]) -> dict[str, str]:
    """``packages``' installed versions in ``python``'s environment (empty if none)."""
    if python is None:
        return {}
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code, *packages], capture_output=True, text=True, timeout=60
        )
        versions: dict[str, str] = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    return versions


@contextlib.contextmanager
def emulator(latency: Any = "same-region", **kwargs: Any) -> Iterator[Any]:
    """A started model-store :class:`torchbucket.emulator.Emulator`.

    Args:
        latency: ``None``, a preset name or a ``LatencyModel``. Default
            ``"same-region"``.
        **kwargs: Passed to ``Emulator`` (``rps_cap``...).
    """
    from torchbucket.emulator import Emulator

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = str(LOG_DIR / f"emulator-{os.getpid()}.log")
    kwargs.setdefault("log_path", log)
    with Emulator("model", latency=latency, **kwargs) as emu:
        yield emu


def seed(
    emu: Any, bucket: str, *, count: int, size: int, prefix: str = "", seed: int = 0
) -> list[str]:
    """Create ``bucket`` if needed and have the server generate objects in it.

    Contents are ``generated_bytes(name, size, seed)``, which
    ``_contenders/_common.Verifier`` checks.

    Returns:
        The objects' names, sorted.
    """
    from torchbucket.emulator import generated_names
    from torchbucket.errors import StorageError

    with contextlib.suppress(StorageError):  # exists already (409)
        emu.create_bucket(bucket)
    emu.seed_generated(bucket, count=count, size=size, prefix=prefix, seed=seed)
    return sorted(generated_names(prefix, count, "sequential", seed))


# ------------------------------------------------------------------ running


class ContenderError(RuntimeError):
    """A contender failed: non-zero exit, timeout or no result line."""


@dataclass
class ContenderRun:
    """One run of one contender.

    Attributes:
        name: The contender's label.
        data: What the contender printed on its ``CONTENDER {json}`` line
            (its measured phase: ``wall_s``, ``cpu_s``, ``server``...).
        process_wall_s: Wall time of the whole process, start-up included
            (the imports too, unless forked from a zygote: ``_zygote.py``).
        process_cpu_s: CPU of the whole process tree (user + system, start-up
            included; the imports too, unless forked from a zygote), from
            ``RUSAGE_CHILDREN`` (a zygote's ``wait4``).
        peak_rss_main_mb: Peak RSS of the contender's main process, MiB
            (sampled every ``sample_interval``).
        peak_rss_worker_mb: Highest peak RSS among its workers, MiB: the pids
            the contender lists as ``worker_pids`` in its result (DataLoader
            workers), else every descendant; 0 when it had none.
        peak_rss_workers_mb: Peak RSS of each of those, MiB, by pid.
        maxrss_children_mb: ``ru_maxrss`` over the tree (the largest process's
            peak, exact rather than sampled), MiB.
    """

    name: str
    data: dict[str, Any]
    process_wall_s: float
    process_cpu_s: float
    peak_rss_main_mb: float
    peak_rss_worker_mb: float
    peak_rss_workers_mb: dict[int, float] = field(default_factory=dict)
    maxrss_children_mb: float = 0.0

    def get(self, key: str, default: Any = None) -> Any:
        """A value by dotted path: ``"data.server.class_b"``, ``"process_cpu_s"``."""
        value: Any = self
        for part in key.split("."):
            if isinstance(value, Mapping):
                if part not in value:
                    return default
                value = value[part]
            elif hasattr(value, part):
                value = getattr(value, part)
            else:
                return default
        return value

    def flat(self) -> dict[str, Any]:
        """Every numeric figure under a dotted name (for medians and JSON)."""
        out: dict[str, Any] = {
            "process_wall_s": self.process_wall_s,
            "process_cpu_s": self.process_cpu_s,
            "peak_rss_main_mb": self.peak_rss_main_mb,
            "peak_rss_worker_mb": self.peak_rss_worker_mb,
            "maxrss_children_mb": self.maxrss_children_mb,
        }
        _flatten("data", self.data, out)
        return out


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = value


class _RssSampler(threading.Thread):
    """Polls the RSS of a process and its descendants (psutil) until stopped."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.main_peak = 0
        self.child_peaks: dict[int, int] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is in the dev extra
            return
        try:
            proc = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop_event.is_set():
            try:
                self.main_peak = max(self.main_peak, proc.memory_info().rss)
                children = proc.children(recursive=True)
            except psutil.Error:
                break
            for child in children:
                try:
                    rss = child.memory_info().rss
                except psutil.Error:
                    continue
                if rss > self.child_peaks.get(child.pid, 0):
                    self.child_peaks[child.pid] = rss
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def _children_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, float(r.ru_maxrss)


def _ensure_crc_cache() -> None:
    """The contenders' cache of expected CRC32Cs (``_contenders/_common.py``'s
    ``expected_crcs``): one directory per benchmark process, named in its
    environment (so every contender and zygote it starts inherits it), removed
    at its exit."""
    if not os.environ.get(CRC_CACHE_ENV):
        os.environ[CRC_CACHE_ENV] = path = tempfile.mkdtemp(prefix="tb-bench-crc-")
        atexit.register(shutil.rmtree, path, ignore_errors=True)


def _run_fresh(
    name: str, cmd: list[str], env: Mapping[str, str], log_path: Path, timeout: float,
    sample_interval: float,
) -> tuple[bytes, int, float, float, _RssSampler]:  # fmt: skip
    """``cmd`` in a new session: its stdout, status, CPU (``RUSAGE_CHILDREN`` delta), maxrss."""
    cpu0, _ = _children_cpu()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
        )
        sampler = _RssSampler(proc.pid, sample_interval)
        sampler.start()
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise ContenderError(f"{name}: timed out after {timeout} s; log {log_path}") from exc
        finally:
            sampler.stop()
    cpu1, maxrss_kb = _children_cpu()
    with contextlib.suppress(ProcessLookupError):  # workers it left behind
        os.killpg(proc.pid, signal.SIGKILL)
    return out, proc.returncode, cpu1 - cpu0, maxrss_kb, sampler


def _run_forked(
    zygote: Zygote, name: str, path: Path, arg: str, env: Mapping[str, str], log_path: Path,
    timeout: float, sample_interval: float,
) -> tuple[bytes, int, float, float, _RssSampler]:  # fmt: skip
    """The same, forked from ``zygote``: CPU and maxrss from the zygote's ``wait4``."""
    out_path = log_path.with_suffix(".out")
    pid = zygote.start(path, [arg], env, out_path, log_path)
    sampler = _RssSampler(pid, sample_interval)
    sampler.start()
    try:
        done = zygote.wait(timeout)
        if done is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            zygote.wait(None)
            raise ContenderError(f"{name}: timed out after {timeout} s; log {log_path}")
    finally:
        sampler.stop()
    with contextlib.suppress(ProcessLookupError):  # workers it left behind
        os.killpg(pid, signal.SIGKILL)
    out = out_path.read_bytes()
    out_path.unlink()
    return out, done.status, done.cpu_s, done.maxrss_kb, sampler


def run_contender(
    name: str,
    script: str | os.PathLike[str],
    spec: Mapping[str, Any],
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900.0,
    sample_interval: float = 0.05,
    zygotes: Zygotes | None = None,
) -> ContenderRun:
    """Run one contender script in a process of its own and collect its figures.

    The script (``script`` relative to ``benchmarks/_contenders/`` unless it is
    absolute) gets ``json.dumps(spec)`` as its only argument and must print
    ``CONTENDER {json}`` as its last stdout line. Its stderr goes to
    ``bench-output/logs/<name>.log``. Run contenders one at a time: the
    process CPU comes from ``RUSAGE_CHILDREN`` deltas of this process.

    Args:
        name: A label (also the log's name).
        script: The contender script.
        spec: Its JSON argument.
        python: The interpreter; default this one (``sys.executable``).
        env: Extra environment variables (``STORAGE_EMULATOR_HOST``...).
        timeout: Seconds before the process group is killed.
        sample_interval: Seconds between two RSS samples.
        zygotes: Fork the process from an interpreter that has done its
            imports (``_zygote.py``) where one serves this interpreter and
            environment, instead of starting a fresh one; the figures are the
            same, the seconds of ``import torch`` are paid once.

    Returns:
        The run's figures.

    Raises:
        ContenderError: The process failed, timed out or printed no result.
    """
    path = Path(script)
    if not path.is_absolute():
        path = CONTENDERS_DIR / path
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    log_path = LOG_DIR / f"{safe}.log"
    _ensure_crc_cache()
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    arg = json.dumps(dict(spec))
    if len(arg) > 32_000:  # the kernel caps one argument at 128 KiB
        spec_path = LOG_DIR / f"{safe}.spec.json"
        spec_path.write_text(arg)
        arg = f"@{spec_path}"
    zygote = zygotes.get(python, full_env) if zygotes is not None else None
    t0 = time.perf_counter()
    if zygote is not None:
        out, returncode, cpu, maxrss_kb, sampler = _run_forked(
            zygote, name, path, arg, full_env, log_path, timeout, sample_interval
        )
    else:
        out, returncode, cpu, maxrss_kb, sampler = _run_fresh(
            name, [python or sys.executable, str(path), arg], full_env, log_path, timeout,
            sample_interval,
        )  # fmt: skip
    wall = time.perf_counter() - t0
    lines = out.decode("utf-8", "replace").splitlines()
    result_lines = [ln for ln in lines if ln.startswith("CONTENDER ")]
    if returncode != 0 or not result_lines:
        try:
            tail = log_path.read_text("utf-8", "replace")[-3000:]
        except OSError as exc:  # someone removed bench-output/ meanwhile
            tail = f"(log unreadable: {exc})"
        raise ContenderError(
            f"{name}: exit status {returncode}, "
            f"{'no' if not result_lines else 'a'} result line; log {log_path}:\n{tail}"
        )
    data = json.loads(result_lines[-1][len("CONTENDER ") :])
    mib = 1024.0 * 1024.0
    child_peaks = {pid: rss / mib for pid, rss in sampler.child_peaks.items()}
    workers = data.get("worker_pids")
    if workers:  # the contender named its DataLoader workers: only they count
        child_peaks = {pid: child_peaks[pid] for pid in workers if pid in child_peaks}
    return ContenderRun(
        name=name,
        data=data,
        process_wall_s=wall,
        process_cpu_s=cpu,
        peak_rss_main_mb=sampler.main_peak / mib,
        peak_rss_worker_mb=max(child_peaks.values(), default=0.0),
        peak_rss_workers_mb=child_peaks,
        maxrss_children_mb=maxrss_kb / 1024.0,  # ru_maxrss is KiB on Linux
    )


# ---------------------------------------------------------------- statistics


def repeat(n: int, fn: Callable[[], T]) -> list[T]:
    """Call ``fn`` ``n`` times; return the results in order."""
    return [fn() for _ in range(n)]


def median(values: Sequence[float]) -> float:
    """The median (``nan`` for no values)."""
    clean = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return statistics.median(clean) if clean else math.nan


def medians(runs: Sequence[ContenderRun]) -> dict[str, float]:
    """The median of every numeric figure over ``runs``, by dotted name."""
    flats = [r.flat() for r in runs]
    keys = sorted({k for f in flats for k in f})
    return {k: median([f[k] for f in flats if k in f]) for k in keys}


def median_figures(
    runs: Sequence[Mapping[str, Any]], *, last: Sequence[str] = ("by_op",)
) -> dict[str, Any]:
    """The median of each numeric figure of a contender's runs (dicts of figures).

    Args:
        runs: One dict per run, all with the keys of the first.
        last: Keys taken from the last run as they are (request counts by
            operation...).

    Returns:
        The medians, the ``last`` keys and ``repeats``; ``{}`` for no runs.
    """
    if not runs:
        return {}
    out: dict[str, Any] = {
        k: median([r[k] for r in runs])
        for k, v in runs[0].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    for key in last:
        out[key] = runs[-1][key]
    out["repeats"] = len(runs)
    return out


def add_latency_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--latency``: emulator latency presets, alternated repeat by repeat (issue 19)."""
    parser.add_argument(
        "--latency",
        default="same-region,same-region-tail",
        help="comma-separated emulator latency presets, alternated repeat by repeat (default "
        "both: the constant same-region and same-region-tail, its medians with a tail and stalls); "
        "the first one's figures are the main RESULT keys",
    )


def alternating_runs(
    emu: Any,
    presets: Sequence[str],
    repeats: int,
    contenders: Sequence[T],
    latency: Callable[[str], Any] = lambda preset: preset,
    rotate: bool = False,
) -> Iterator[tuple[int, str, T]]:
    """Every run of a benchmark, ``(repeat, preset, contender)``, the emulator set for each.

    Each repeat runs every contender under every preset (``latency(preset)``
    is what the emulator is set to), the presets in the given order and then
    reversed, in turn. So the VM's drift within a run (a third for one
    contender within minutes on the 2-core VM) weighs on each preset alike;
    run one preset's repeats after another's, the last preset took all of it
    (docs/benchmarks.md, dataloading run N). With ``rotate`` each repeat
    starts one contender further on, for the same reason.

    Every run starts a fresh sampler seeded with the model's ``seed`` plus the
    repeat's number: within a repeat every contender meets the same draws (in
    the order it sends its requests), and each repeat draws anew. Before,
    the sampler was set once per preset and repeat, so a contender's repeats
    all started from one point of one sequence, shifted only by the requests
    of the contenders before it: one sample of the tail's stalls, not three.
    """
    n = len(contenders)
    for rep in range(repeats):
        k = rep % n if rotate and n else 0
        contenders_now = [*contenders[k:], *contenders[:k]]
        for preset in presets if rep % 2 == 0 else list(reversed(presets)):
            model = reseeded(latency(preset), rep)
            for c in contenders_now:
                emu.set_latency(model)
                yield rep, preset, c


def reseeded(latency: Any, offset: int) -> Any:
    """``latency`` (a preset name, a ``LatencyModel`` or ``None``) as a model seeded ``offset`` on."""
    from torchbucket.emulator import resolve_latency

    model = resolve_latency(latency)
    if model is None:
        return None
    return replace(model, seed=model.seed + offset)


def latency_presets(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The presets ``--latency`` named; an unknown one is a usage error naming it."""
    from torchbucket.emulator import PRESETS

    presets = [x for x in args.latency.split(",") if x]
    unknown = [x for x in presets if x not in PRESETS]
    if unknown or not presets:
        parser.error(f"--latency: unknown preset(s) {unknown}; known: {', '.join(PRESETS)}")
    return presets


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, ``nan`` where undefined."""
    try:
        if denominator == 0 or math.isnan(denominator) or math.isnan(numerator):
            return math.nan
    except TypeError:
        return math.nan
    return numerator / denominator


# ------------------------------------------------------------------ reporting


def machine_info() -> dict[str, Any]:
    """Where and when: CPUs, RAM, CPU model, Python, torch, date (UTC)."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram = math.nan
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) / (1024 * 1024)
                break
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover
        torch_version = None
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover
        load = (math.nan, math.nan, math.nan)
    return {
        "nproc": os.cpu_count(),
        "ram_gib": round(ram, 1),
        "cpu_model": model,
        "python": platform.python_version(),
        "torch": torch_version,
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in load],
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if spec == "s":
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def format_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]
) -> list[str]:
    """Rows as aligned text lines.

    Args:
        rows: One mapping per row.
        columns: ``(key, header, format spec)``, e.g. ``("rate", "obj/s", ".0f")``;
            format ``"s"`` prints the value as it is.
    """
    cells = [[h for _, h, _ in columns]]
    cells += [[_fmt(r.get(k), spec) for k, _, spec in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def print_table(
    title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]
) -> None:
    """Print ``title`` and an aligned table (see :func:`format_table`)."""
    print(f"\n{title}")
    for line in format_table(rows, columns):
        print("  " + line)
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, ContenderRun):
        return _jsonable(value.__dict__)
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``bench-output/<name>.json`` with ``machine`` and ``command`` added.

    NaN becomes ``null``; :class:`ContenderRun` objects become dicts.

    Returns:
        The file's path.
    """
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "command": " ".join(["python", *[_rel(a) for a in sys.argv]]),
        "machine": machine_info(),
        **payload,
    }
    path = OUTPUT_DIR / f"{name}.json"
    path.write_text(json.dumps(_jsonable(doc), indent=2, sort_keys=False) + "\n")
    return path


def rel(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the repository root where it lies inside it, else as given."""
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(ROOT))
    return str(path)


_rel = rel


def emit_result(payload: Mapping[str, Any]) -> None:
    """Print the final ``RESULT {json}`` line (call it last)."""
    sys.stdout.write("RESULT " + json.dumps(_jsonable(payload), sort_keys=True) + "\n")
    sys.stdout.flush()


@dataclass
class Panel:
    """One bar chart in a figure.

    Attributes:
        title: The panel's title.
        labels: One per bar.
        values: Bar heights (``nan``/``None`` draws no bar).
        ylabel: The axis label.
        goal: Optional horizontal line (a goal), with ``goal_label``.
        log: Logarithmic y axis.
    """

    title: str
    labels: Sequence[str]
    values: Sequence[float | None]
    ylabel: str = ""
    goal: float | None = None
    goal_label: str = ""
    log: bool = False


def bar_chart(
    name: str, panels: Sequence[Panel], *, suptitle: str = "", ncols: int | None = None
) -> Path:
    """Draw panels into ``bench-output/<name>.png`` (matplotlib Agg).

    Args:
        name: The file's stem.
        panels: The charts.
        suptitle: A title over them all.
        ncols: Panels per row; default all in one row.

    Returns:
        The file's path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    n = len(panels)
    cols = min(n, ncols or n)
    rows = math.ceil(n / cols)
    width = max(5.0, max(len(p.labels) for p in panels) * 0.9)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 4.6 * rows), squeeze=False)
    flat_axes = [ax for row in axes for ax in row]
    for ax in flat_axes[n:]:
        ax.set_visible(False)
    for ax, panel in zip(flat_axes, panels):
        values = [math.nan if v is None else float(v) for v in panel.values]
        xs = range(len(values))
        bars = ax.bar(xs, [0.0 if math.isnan(v) else v for v in values], color="#4878a8")
        for bar, label in zip(bars, panel.labels):
            if label.startswith("torchbucket"):
                bar.set_color("#d9822b")
        for x, v in zip(xs, values):
            if not math.isnan(v):
                ax.annotate(
                    _short(v),
                    (x, v),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
        ax.set_xticks(list(xs))
        ax.set_xticklabels(panel.labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel)
        if panel.log:
            ax.set_yscale("log")
        if panel.goal is not None:
            ax.axhline(panel.goal, color="#a83232", linestyle="--", linewidth=1)
            if panel.goal_label:
                ax.annotate(
                    panel.goal_label,
                    (len(values) - 0.5, panel.goal),
                    ha="right",
                    va="bottom",
                    fontsize=8,
                    color="#a83232",
                )
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    path = OUTPUT_DIR / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _short(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"
