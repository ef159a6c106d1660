"""A dataset epoch run as its own process, for the crash tests to kill.

Reads every object under ``gs://BUCKET/d/`` through a map-style dataset with
compose on, batch at a time, in the main process (``--workers 0``) or in DataLoader workers
(forked). Prints, one line each, flushed:

- ``WORKERS pid ...``: the DataLoader's workers are up (``--workers`` > 0);
- ``COMPOSING``: this process holds composites in flight (``--workers 0``);
- ``DONE count digest``: the epoch finished: samples read, and a digest of
  them sorted, to compare with the bucket's contents;
- ``FAILED type: message``: the epoch raised (exit status 3).

Usage: ``python _crash_epoch.py ENDPOINT BUCKET [--workers N]``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import threading
import time

from torch.utils.data import DataLoader

from torchbucket.compose import ComposeConfig
from torchbucket.compose.registry import in_flight
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketMapDataset
from torchbucket.storage.gcs import GCSConfig

# Long timeouts: a request the test holds (a stalled delete) stays held until
# the test kills this process; it is not abandoned and retried meanwhile.
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=60.0, attempt_timeout=60.0, read_timeout=60.0
)


def say(line: str) -> None:
    print(line, flush=True)


def digest(samples: list[bytes]) -> str:
    h = hashlib.sha256()
    for sample in sorted(samples):
        h.update(len(sample).to_bytes(8, "big"))
        h.update(sample)
    return h.hexdigest()[:16]


def watch_composites() -> None:
    """Say COMPOSING once this process has registered a composite."""
    while not in_flight():
        time.sleep(0.005)
    say("COMPOSING")


def as_list(batch: list[bytes]) -> list[bytes]:
    return list(batch)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("bucket")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    gcs = GCSConfig(endpoint=args.endpoint, anonymous=True, retry=RETRY)
    ds = BucketMapDataset.from_prefix(
        f"gs://{args.bucket}/d/", gcs=gcs, compose=ComposeConfig(throttle_cooldown=0.0)
    )
    # A sampler the dataset does not read ahead of (a plain range): each batch
    # is composed when it is asked for, its two groups the composites the
    # tests hold (reading ahead, a window composes many groups at once:
    # test_dataset_emulator.py's worker-kill test covers that path).
    loader = DataLoader(
        ds,
        batch_size=64,
        sampler=range(len(ds)),
        num_workers=args.workers,
        collate_fn=as_list,
        multiprocessing_context="fork" if args.workers else None,
    )
    if args.workers == 0:
        threading.Thread(target=watch_composites, daemon=True).start()
    samples: list[bytes] = []
    try:
        iterator = iter(loader)
        if args.workers:
            pids = [w.pid for w in iterator._workers]  # type: ignore[attr-defined]
            say("WORKERS " + " ".join(str(p) for p in pids))
        for batch in iterator:
            samples.extend(batch)
    except Exception as exc:  # reported to the test, which decides
        say(f"FAILED {type(exc).__name__}: {exc}")
        return 3
    say(f"DONE {len(samples)} {digest(samples)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
