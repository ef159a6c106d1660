"""Setup for ``benchmarks/shards.py``, outside every measured epoch.

The samples the contenders read (bytes their ``Verifier`` checks), and the
shards packed from them once per dataset with ``torchbucket.shards.pack``,
timed and counted apart.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "_contenders"))

from _common import expected_bytes


def seed(emu: Any, bucket: str, *, prefix: str, count: int, size: int) -> None:
    """Create ``bucket`` with objects ``<prefix><n:08d>.bin`` of ``expected_bytes``."""
    emu.create_bucket(bucket)
    batch: dict[str, bytes] = {}
    for i in range(count):
        name = f"{prefix}{i:08d}.bin"
        batch[name] = expected_bytes(name, size)
        if len(batch) * size >= 64 << 20:
            emu.seed(bucket, batch)
            batch = {}
    if batch:
        emu.seed(bucket, batch)


def pack_set(
    emu: Any, bucket: str, *, prefix: str, shards_prefix: str, shard_size: int
) -> dict[str, Any]:
    """Pack ``gs://bucket/prefix`` into ``shards_prefix``: its time, shards and requests."""
    from torchbucket.shards import PackConfig, pack
    from torchbucket.storage.gcs import GCSConfig

    gcs = GCSConfig(endpoint=emu.endpoint, anonymous=True)
    emu.reset_stats()
    t0 = time.perf_counter()
    result = pack(
        f"gs://{bucket}/{prefix}",
        f"gs://{bucket}/{shards_prefix}",
        config=PackConfig(shard_size=shard_size),
        gcs=gcs,
        progress=False,
    )
    seconds = time.perf_counter() - t0
    stats = emu.stats()
    return {
        "seconds": seconds,
        "shards": len(result.shards),
        "bytes": result.bytes,
        "class_a": stats["by_class"].get("A", 0),
        "class_b": stats["by_class"].get("B", 0),
        "names": [shards_prefix + s.name for s in result.shards],
    }
