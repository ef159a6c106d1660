"""Shared pieces of the reliability suite: buckets, configs and the two workloads.

The workloads are what a user runs: a dataset epoch (list, then read every
object, compose on where asked) and a checkpoint save followed by a load. Each
returns what it produced, or raises what the user would see; the tests decide
which outcome the fault allows and check what the bucket holds afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.compose import COMPOSITE_PREFIX, ComposeConfig
from torchbucket.compose.registry import cleanup_registered, in_flight
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.datasets import BucketIterableDataset, FetchConfig
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig, GCSStore

#: Objects in a dataset workload: tiny, sizes varied so a split error shows.
N_OBJECTS = 50

#: A stall outlasts every client timeout below, and ends by itself soon after.
STALL_SECONDS = 3.0

#: Retries that ride out a few faults: fast backoff, a roomy deadline, and a
#: short silence limit so a stalled request is abandoned within a fraction of a
#: second (and retried).
RECOVER = RetryConfig(
    initial_backoff=0.005, max_backoff=0.02, deadline=20.0, attempt_timeout=5.0, read_timeout=0.3
)

#: Retries that must give up: the same, with a deadline of one second. Not
#: less: with half a second, under make test's load, a zonal epoch's first
#: gRPC read once did not reach the server before the deadline, so the case's
#: fault never fired (CI, 2026-12-05).
GIVE_UP = RetryConfig(
    initial_backoff=0.005, max_backoff=0.02, deadline=1.0, attempt_timeout=0.5, read_timeout=0.3
)

#: Checkpoint parts small enough that a save is several parts (multipart), and
#: loads several ranges.
PART = 64 * 1024
#: A resumable chunk (GCS's minimum), so a resumable save is several chunks.
CHUNK = 256 * 1024


def payload(i: int) -> bytes:
    """Object ``i``'s bytes: distinct per object, 11 to 231 bytes."""
    return f"<{i:03d}>".encode() * (1 + (i * 7) % 21) + b"|"


def object_name(i: int) -> str:
    """Object ``i``'s name in a dataset bucket."""
    return f"d/{i:03d}.bin"


def state(seed: int) -> dict[str, Any]:
    """A checkpoint's content, about 600 KB, different for each seed."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(600, 256, generator=g), "step": seed}


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two checkpoint contents are identical."""
    return bool(torch.equal(a["w"], b["w"])) and a["step"] == b["step"]


@dataclass
class Bucket:
    """A fresh bucket on an emulator, and how to reach it."""

    emu: Emulator
    name: str

    @property
    def zonal(self) -> bool:
        """Whether the bucket is zonal (``bucket_kind`` ``zonal``: read and written over gRPC)."""
        # Here, not at the top: the matrix also runs as a script (its table).
        from bucket_kinds import ZonalBuckets

        return isinstance(self.emu, ZonalBuckets)

    def gcs(self, retry: RetryConfig = RECOVER, **options: Any) -> GCSConfig:
        """A GCSConfig for this emulator with ``retry``."""
        return GCSConfig(endpoint=self.emu.endpoint, anonymous=True, retry=retry, **options)

    def store(self, retry: RetryConfig = RECOVER) -> GCSStore:
        """A store on this bucket (closed by the fixture)."""
        return GCSStore(self.name, config=self.gcs(retry))

    def uri(self, key: str = "") -> str:
        """``gs://bucket/key``."""
        return f"gs://{self.name}/{key}"

    def composites(self) -> list[str]:
        """Composite objects in the bucket now."""
        return self.emu.object_names(self.name, COMPOSITE_PREFIX)

    def incomplete_uploads(self) -> list[str]:
        """Keys of the incomplete multipart uploads in the bucket now."""
        store = self.store()
        try:
            return [u.key for u in runtime.run(store.multipart_list(""))]
        finally:
            runtime.run(store.close())

    # -- the dataset workload ------------------------------------------------

    def seed_dataset(self, n: int = N_OBJECTS) -> dict[str, bytes]:
        """Seed ``n`` objects under ``d/``; return the expected bytes by URI."""
        objects = {object_name(i): payload(i) for i in range(n)}
        self.emu.seed(self.name, objects)
        return {self.uri(k): v for k, v in objects.items()}

    def dataset(
        self, retry: RetryConfig = RECOVER, *, compose: bool = True, **kw: Any
    ) -> BucketIterableDataset:
        """The objects under ``d/`` as an iterable dataset (lists them now)."""
        return BucketIterableDataset.from_prefix(
            self.uri("d/"),
            gcs=self.gcs(retry),
            compose=ComposeConfig(enabled=compose, throttle_cooldown=0.0),
            fetch=FetchConfig(reads_in_flight=64),
            **kw,
        )

    # -- the checkpoint workload -----------------------------------------------

    def checkpoint(
        self,
        retry: RetryConfig = RECOVER,
        *,
        method: str = "multipart",
        hedge: bool = True,
        **kw: Any,
    ) -> BucketCheckpoint:
        """A BucketCheckpoint with small parts (or chunks) on this emulator.

        ``hedge=False`` for a test that counts GETs: on a busy machine a range
        slower than the hedger's first wait is sent twice, and a fault set for
        the n-th GET then falls on another read.
        """
        options: dict[str, Any] = {
            "part_size": PART,
            "min_part_size": 1024,
            "parts_in_flight": 4,
            "range_size": PART,
            "upload_method": method,
        }
        options.update(kw)
        gcs = self.gcs(retry, upload_chunk_size=CHUNK, hedge=HedgeConfig(enabled=hedge))
        return BucketCheckpoint(config=CheckpointConfig(**options), gcs=gcs)


def epoch(ds: BucketIterableDataset) -> list[bytes]:
    """One epoch in this process, every sample's bytes."""
    return list(ds)


def check_epoch(samples: list[bytes], expected: dict[str, bytes]) -> None:
    """Every expected object exactly once, with its bytes (the order is the listing's)."""
    assert len(samples) == len(expected), f"{len(samples)} samples, expected {len(expected)}"
    assert samples == [expected[k] for k in sorted(expected)]


def delete_registered_composites() -> int:
    """Delete what this process's compose registry still holds (as exit does)."""
    if not in_flight():
        return 0
    return runtime.run(cleanup_registered())
