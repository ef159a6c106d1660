"""Soak benchmark (issue 7): epochs under a request cap, every byte checked.

On the emulator's model store behind the ``same-region`` latency model, a
``BucketMapDataset`` (compose off: one GET per sample, so requests and samples
are counted alike) goes through ``DataLoader(num_workers=2, batch_size=32,
shuffle=True, persistent_workers=True)``: one warm-up epoch without a cap
measures what the loader asks for, then the server's requests-per-second cap
(answering 429 with ``Retry-After`` above it) is set well below that and
several epochs run back to back. In this process (the loader's main process;
the server is a subprocess with its own CPU):

- every byte of every sample is compared with what the object holds, and each
  object must arrive exactly once per epoch;
- the server's counters per epoch: GETs answered 2xx, 429s;
- the client's retries, counted in each worker: the retry notices the library
  logs (``torchbucket.runtime.retry``, one per retried attempt) and the adaptive
  limiter's ``throttle_events``, carried to the consumer with each sample;
- RSS of the main process and of each worker, sampled every 0.25 s and at the
  end of every epoch.

Ends with ``RESULT {json}``: ``bytes_mismatched`` (0), ``objects_missing``
(0), ``objects_duplicated`` (0), ``rss_growth_fraction`` (main + workers,
end of the first capped epoch to the end of the last; goal <= 0.1) and
``throughput_fraction_of_cap``: GETs answered 2xx during the capped epochs, less
one burst of the token bucket (one second of the cap), over the cap times the
whole span of those epochs, gaps between them included (goal >= 0.8).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

NAME = "soak"
BUCKET = "soak"
PREFIX = "s/"
BATCH_SIZE = 32
NUM_WORKERS = 2
MiB = 1 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="2,000 objects, 5 capped epochs")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes (a code-path check)")
    p.add_argument("--objects", type=int, default=None, help="objects in the dataset (5,000)")
    p.add_argument("--size", type=int, default=16 << 10, help="bytes per object (16 KiB)")
    p.add_argument("--epochs", type=int, default=None, help="capped epochs (10)")
    p.add_argument("--rps-cap", type=float, default=None, help="requests/s cap (300)")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="samples as tensors in shared memory the workers reuse "
        "(FetchConfig(output='tensor', reuse_shared_memory=True)); default: bytes",
    )
    args = p.parse_args(argv)
    if args.objects is None:
        args.objects = 300 if args.smoke else 2000 if args.quick else 5000
    if args.epochs is None:
        args.epochs = 2 if args.smoke else 5 if args.quick else 10
    if args.rps_cap is None:
        args.rps_cap = 300.0
    return args


# ------------------------------------------------------------ in the workers


class _RetryCounter(logging.Handler):
    """Counts the retry notices ``torchbucket.runtime.retry`` logs (one per retried attempt)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        # retry.call reports each retry through its episode log's ``note``
        # (WARNING for the first of an episode, DEBUG after): count by origin.
        if record.funcName == "note":
            self.count += 1


_counter: _RetryCounter | None = None
_limiter: Any = None


def worker_init(worker_id: int) -> None:
    """Install the retry counter in a DataLoader worker."""
    global _counter
    _counter = _RetryCounter()
    log = logging.getLogger("torchbucket.runtime.retry")
    log.addHandler(_counter)
    log.setLevel(logging.DEBUG)


@dataclass(frozen=True)
class Tagged:
    """``data_format_fn``: the bytes, with the worker's pid and its retry counts."""

    endpoint: str

    def __call__(self, data: bytes) -> tuple[bytes, int, int, int]:
        global _limiter
        if _limiter is None:
            from torchbucket import runtime
            from torchbucket.runtime import retry

            async def find() -> Any:
                return retry.get_limiter(self.endpoint)

            _limiter = runtime.run(find())
        retries = _counter.count if _counter is not None else -1
        return data, os.getpid(), retries, _limiter.throttle_events


def collate(batch: list[Any]) -> list[Any]:
    """A batch as the list of its samples."""
    return batch


# ------------------------------------------------------------ in the consumer


class Checker:
    """Counts wrong bytes, missing and duplicated objects, epoch by epoch."""

    def __init__(self, names: list[str], size: int, seed: int = 0) -> None:
        import hashlib

        self.size = size
        self.by_digest = {
            hashlib.blake2b(f"{seed}:{n}".encode(), digest_size=32).digest(): n for n in names
        }
        self.names = set(names)
        self.bytes_mismatched = 0
        self.objects_missing = 0
        self.objects_duplicated = 0
        self.bytes_checked = 0
        self._seen: set[str] = set()

    def check(self, data: Any) -> None:
        import numpy as np

        if not isinstance(data, bytes):  # a tensor (--reuse): its bytes, copied
            data = data.numpy().tobytes()

        self.bytes_checked += len(data)
        name = self.by_digest.get(bytes(data[:32]))
        if name is None:  # not the start of any object: every byte is wrong
            self.bytes_mismatched += max(len(data), self.size)
            return
        expected = (bytes(data[:32]) * (self.size // 32 + 1))[: self.size]
        if data != expected:
            n = min(len(data), self.size)
            got = np.frombuffer(data, dtype=np.uint8, count=n)
            want = np.frombuffer(expected, dtype=np.uint8, count=n)
            self.bytes_mismatched += int(np.count_nonzero(got != want)) + abs(len(data) - self.size)
        if name in self._seen:
            self.objects_duplicated += 1
        self._seen.add(name)

    def end_epoch(self) -> int:
        """Close an epoch; return how many objects it missed."""
        missing = len(self.names - self._seen)
        self.objects_missing += missing
        self._seen = set()
        return missing


class RssSampler(threading.Thread):
    """RSS of this process and the given workers every ``interval`` seconds."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.pids: list[int] = []
        self.samples: list[tuple[float, int, int]] = []  # (t, main, workers)
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def now(self) -> tuple[int, dict[int, int]]:
        import psutil

        main = psutil.Process().memory_info().rss
        workers = {}
        for pid in self.pids:
            try:
                workers[pid] = psutil.Process(pid).memory_info().rss
            except psutil.Error:
                workers[pid] = 0
        return main, workers

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            main, workers = self.now()
            self.samples.append((time.monotonic() - self._t0, main, sum(workers.values())))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def run_epoch(loader: Any, checker: Checker, emu: Any, sampler: RssSampler) -> dict[str, Any]:
    """One epoch: every sample checked; the server's counters and RSS after it."""
    emu.reset_stats()
    retries: dict[int, int] = {}
    throttles: dict[int, int] = {}
    samples = 0
    t0 = time.perf_counter()
    for batch in loader:
        for data, pid, n_retries, n_throttles in batch:
            checker.check(data)
            samples += 1
            retries[pid] = max(retries.get(pid, 0), n_retries)
            throttles[pid] = max(throttles.get(pid, 0), n_throttles)
            if pid not in sampler.pids:
                sampler.pids.append(pid)
    wall = time.perf_counter() - t0
    stats = emu.stats()
    missing = checker.end_epoch()
    by_status = {str(k): int(v) for k, v in stats.get("by_status", {}).items()}
    ok = sum(v for k, v in by_status.items() if k.startswith("2"))
    main, workers = sampler.now()
    return {
        "wall_s": wall,
        "samples": samples,
        "samples_per_s": samples / wall,
        "gets_ok": ok,
        "gets_ok_per_s": ok / wall,
        "status_429": by_status.get("429", 0),
        "by_status": by_status,
        "by_op": stats.get("by_op", {}),
        "server_cpu_s": float(stats.get("cpu_seconds", math.nan)),
        "missing": missing,
        "retries_total": sum(retries.values()),  # cumulative per worker
        "throttle_events_total": sum(throttles.values()),
        "rss_main_mib": main / MiB,
        "rss_workers_mib": {str(p): r / MiB for p, r in workers.items()},
        "rss_total_mib": (main + sum(workers.values())) / MiB,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    from torch.utils.data import DataLoader

    from torchbucket.compose import ComposeConfig
    from torchbucket.datasets import BucketMapDataset, FetchConfig
    from torchbucket.storage.gcs import GCSConfig

    fetch = FetchConfig(output="tensor", reuse_shared_memory=True) if args.reuse else FetchConfig()
    output = "tensor, reusing shared memory" if args.reuse else "bytes"

    print(
        f"soak ({mode}): {args.objects:,} objects x {args.size // 1024} KiB, "
        f"DataLoader(num_workers={NUM_WORKERS}, batch_size={BATCH_SIZE}, shuffle, persistent "
        f"workers), same-region latency; 1 uncapped warm-up epoch, then {args.epochs} epochs "
        f"at a cap of {args.rps_cap:g} requests/s; samples as {output}; every byte checked."
    )
    epochs: list[dict[str, Any]] = []
    sampler = RssSampler()
    with h.emulator(latency="same-region") as emu:
        names = h.seed(emu, BUCKET, count=args.objects, size=args.size, prefix=PREFIX)
        checker = Checker(names, args.size)
        gcs = GCSConfig(endpoint=emu.endpoint)
        endpoint, _ = gcs.resolved_endpoint()
        dataset = BucketMapDataset.from_prefix(
            f"gs://{BUCKET}/{PREFIX}",
            gcs=gcs,
            compose=ComposeConfig(enabled=False),
            fetch=fetch,
            data_format_fn=Tagged(endpoint),
        )
        loader = DataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            shuffle=True,
            num_workers=NUM_WORKERS,
            persistent_workers=True,
            collate_fn=collate,
            worker_init_fn=worker_init,
        )
        sampler.start()
        warm = run_epoch(loader, checker, emu, sampler)
        print(
            f"  warm-up, no cap: {warm['samples_per_s']:,.0f} samples/s "
            f"(the loader's demand; the cap is {args.rps_cap / warm['samples_per_s']:.2f} of it)"
        )
        emu.set_rps_cap(args.rps_cap)
        span_start = time.perf_counter()
        for n in range(args.epochs):
            e = run_epoch(loader, checker, emu, sampler)
            e["epoch"] = n + 1
            epochs.append(e)
            print(
                f"  epoch {n + 1}: {e['samples_per_s']:,.0f} samples/s, "
                f"{e['gets_ok_per_s']:,.0f} GETs ok/s ({e['gets_ok_per_s'] / args.rps_cap:.2f} "
                f"of the cap), {e['status_429']:,} 429s, RSS main {e['rss_main_mib']:.0f} MiB + "
                f"workers {sum(e['rss_workers_mib'].values()):.0f} MiB",
                flush=True,
            )
        span = time.perf_counter() - span_start
        del loader  # stops the persistent workers
        sampler.stop()

    first, last = epochs[0], epochs[-1]
    prev_retries = warm["retries_total"]
    prev_throttles = warm["throttle_events_total"]
    for e in epochs:  # per-epoch deltas of the workers' cumulative counters
        e["retries"] = e["retries_total"] - prev_retries
        e["throttle_events"] = e["throttle_events_total"] - prev_throttles
        prev_retries, prev_throttles = e["retries_total"], e["throttle_events_total"]
    total_ok = sum(e["gets_ok"] for e in epochs)
    total_wall = sum(e["wall_s"] for e in epochs)
    # Over any span the cap lets through at most rate x span + one burst (the
    # token bucket is full when the cap is set and refills between epochs), so
    # count the whole span, gaps between epochs included, and take a burst off.
    burst = max(1.0, args.rps_cap)
    result: dict[str, Any] = {
        "bytes_mismatched": checker.bytes_mismatched,
        "objects_missing": checker.objects_missing,
        "objects_duplicated": checker.objects_duplicated,
        "rss_growth_fraction": round(
            (last["rss_total_mib"] - first["rss_total_mib"]) / first["rss_total_mib"], 4
        ),
        "throughput_fraction_of_cap": round((total_ok - burst) / span / args.rps_cap, 3),
        "throughput_fraction_of_cap_raw": round(total_ok / total_wall / args.rps_cap, 3),
        "capped_span_s": round(span, 2),
        "samples_per_s": round(sum(e["samples"] for e in epochs) / total_wall, 1),
        "rps_cap": args.rps_cap,
        "output": "tensor_reuse" if args.reuse else "bytes",
        "demand_samples_per_s": round(warm["samples_per_s"], 1),
        "status_429": sum(e["status_429"] for e in epochs),
        "client_retries": sum(e["retries"] for e in epochs),
        "client_throttle_events": sum(e["throttle_events"] for e in epochs),
        "epochs": args.epochs,
        "objects": args.objects,
        "object_size": args.size,
        "bytes_checked": checker.bytes_checked,
        "mode": mode,
    }
    result["goals"] = {
        "no_bytes_mismatched": result["bytes_mismatched"] == 0,
        "no_objects_missing": result["objects_missing"] == 0,
        "no_objects_duplicated": result["objects_duplicated"] == 0,
        "rss_growth_le_0_1": result["rss_growth_fraction"] <= 0.1,
        "throughput_ge_0_8_of_cap": result["throughput_fraction_of_cap"] >= 0.8,
        "cap_below_demand": args.rps_cap < warm["samples_per_s"],
    }

    rows = [
        {
            **e,
            "fraction": e["gets_ok_per_s"] / args.rps_cap,
            "rss_workers_sum": sum(e["rss_workers_mib"].values()),
        }
        for e in epochs
    ]
    h.print_table(
        f"Per epoch, cap {args.rps_cap:g} requests/s:",
        rows,
        [
            ("epoch", "epoch", "d"),
            ("wall_s", "s", ".1f"),
            ("samples_per_s", "samples/s", ",.0f"),
            ("gets_ok_per_s", "GETs ok/s", ",.0f"),
            ("fraction", "of cap", ".2f"),
            ("status_429", "429s", ",d"),
            ("retries", "client retries", ",d"),
            ("throttle_events", "throttle events", ",d"),
            ("missing", "missing", "d"),
            ("server_cpu_s", "server CPU s", ".2f"),
            ("rss_main_mib", "RSS main MiB", ".0f"),
            ("rss_workers_sum", "RSS workers MiB", ".0f"),
            ("rss_total_mib", "RSS total MiB", ".0f"),
        ],
    )
    print(
        f"\n{checker.bytes_checked / MiB:,.0f} MiB checked: {result['bytes_mismatched']} bytes "
        f"wrong, {result['objects_missing']} missing, {result['objects_duplicated']} duplicated; "
        f"throughput {result['throughput_fraction_of_cap']} of the cap "
        f"(GETs ok less one burst over the whole capped span; "
        f"{result['throughput_fraction_of_cap_raw']} over the epochs' own time without that "
        "correction); "
        f"RSS growth {result['rss_growth_fraction']:+.3f} from epoch 1 to {args.epochs}"
    )

    png = _figure(epochs, sampler.samples, args.rps_cap)
    path = h.write_json(
        NAME,
        {
            "result": result,
            "warm_up": warm,
            "epochs": epochs,
            "rss_samples": [
                {"t": round(t, 2), "main_mib": m / MiB, "workers_mib": w / MiB}
                for t, m, w in sampler.samples
            ],
            "figure": h.rel(png),
            "notes": [
                "Compose off: one GET per sample.",
                "GETs ok: answers with a 2xx status during the epoch (the server's count).",
                "throughput_fraction_of_cap: (GETs ok - one second of the cap) / (cap x the "
                "whole span of the capped epochs, gaps between them included). The token bucket "
                "lets at most cap x span + one burst through, so a full bucket does not flatter "
                "it. The per-epoch 'of cap' figures are over each epoch's own time and can "
                "exceed 1 by the tokens saved up between epochs.",
                "Client retries: retry notices logged by torchbucket.runtime.retry in the workers "
                "(one per retried attempt); throttle events: the workers' adaptive limiters.",
                "RSS growth: main + workers at the end of the first capped epoch to the end "
                "of the last.",
            ],
        },
    )
    print(f"wrote {h.rel(path)} and {h.rel(png)}")
    h.emit_result(result)
    return 0


def _figure(
    epochs: list[dict[str, Any]], samples: list[tuple[float, int, int]], cap: float
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h.OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    xs = [e["epoch"] for e in epochs]
    ax1.bar(xs, [e["gets_ok_per_s"] for e in epochs], color="#d9822b", label="GETs ok/s")
    ax1.axhline(cap, color="#a83232", linestyle="--", linewidth=1, label=f"cap {cap:g}/s")
    ax1.axhline(0.8 * cap, color="#888888", linestyle=":", linewidth=1, label="0.8 of cap")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("requests/s")
    ax1.set_title("Throughput held under the cap")
    ax1.legend(fontsize=8)
    ts = [t for t, _, _ in samples]
    ax2.plot(ts, [m / MiB for _, m, _ in samples], label="main")
    ax2.plot(ts, [w / MiB for _, _, w in samples], label="workers (sum)")
    ax2.plot(ts, [(m + w) / MiB for _, m, w in samples], label="total")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("RSS MiB")
    ax2.set_title("RSS over time")
    ax2.legend(fontsize=8)
    fig.suptitle("Soak: map-style dataset under a request cap, same-region latency model")
    fig.tight_layout()
    path = h.OUTPUT_DIR / f"{NAME}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
