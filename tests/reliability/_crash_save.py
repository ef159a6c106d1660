"""A checkpoint save run as its own process, for the crash tests to kill.

Saves ``{"w": randn(600, 256) seeded by STEP, "step": STEP}`` (about 600 KB)
to ``gs://BUCKET/KEY`` through ``BucketCheckpoint`` with 64 KiB parts
(multipart) or 256 KiB chunks (resumable). Prints, one line each, flushed:

- ``MID-SAVE``: ``torch.save`` is writing past the first parts, so parts are
  uploading and the object is not yet complete;
- ``SAVED``: the save completed;
- ``FAILED type: message``: the save raised (exit status 3).

Usage: ``python _crash_save.py ENDPOINT BUCKET KEY STEP [--method M]``.
"""

from __future__ import annotations

import argparse
import io
import sys
from typing import IO, Any, cast

import torch

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.config import RetryConfig
from torchbucket.storage.gcs import GCSConfig

# Long timeouts: a request the test holds stays held until the kill.
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=60.0, attempt_timeout=60.0, read_timeout=60.0
)
PART = 64 * 1024
CHUNK = 256 * 1024


def state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(600, 256, generator=g), "step": step}


class Announcing(io.RawIOBase):
    """Passes writes through; says MID-SAVE when a write reaches byte ``after``."""

    def __init__(self, inner: IO[bytes], after: int) -> None:
        self._inner = inner
        self._after = after
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if self._written < self._after <= self._written + size:
            # Before the write: one write may carry the whole tensor and block
            # while its parts upload.
            print("MID-SAVE", flush=True)
        self._written += size
        return self._inner.write(data)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("bucket")
    parser.add_argument("key")
    parser.add_argument("step", type=int)
    parser.add_argument("--method", default="multipart", choices=["multipart", "resumable"])
    args = parser.parse_args()
    checkpoint = BucketCheckpoint(
        config=CheckpointConfig(
            part_size=PART,
            min_part_size=1024,
            parts_in_flight=2,
            upload_method=args.method,
        ),
        gcs=GCSConfig(endpoint=args.endpoint, anonymous=True, retry=RETRY, upload_chunk_size=CHUNK),
    )
    after = 3 * PART if args.method == "multipart" else 2 * CHUNK
    try:
        with checkpoint.writer(f"gs://{args.bucket}/{args.key}") as f:
            torch.save(state(args.step), cast(IO[bytes], Announcing(f, after)))
    except Exception as exc:  # reported to the test, which decides
        print(f"FAILED {type(exc).__name__}: {exc}", flush=True)
        return 3
    print("SAVED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
