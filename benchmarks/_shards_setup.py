"""Setup for ``benchmarks/shards.py``, outside every measured epoch.

The samples the contenders read (bytes their ``Verifier`` checks), and the
shards packed from them once per dataset with ``torchbucket.shards.pack``,
timed and counted apart.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "_contenders"))

from _common import expected_bytes, object_url


def seed(emu: Any, bucket: str, *, prefix: str, count: int, size: int, zonal: bool = False) -> None:
    """Create ``bucket`` (``zonal``: a zonal one) with objects ``<prefix><n:08d>.bin``
    of ``expected_bytes``."""
    emu.create_bucket(bucket, zonal=zonal)
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


def copy_prefix(emu: Any, source: str, target: str, prefix: str) -> int:
    """Copy every object under ``prefix`` of bucket ``source`` into ``target``, byte for byte.

    Packed shards go to a zonal bucket this way (``shards.py --zonal``): read
    over the JSON API, seeded into ``target``, outside every measured epoch.
    torchbucket's own pack on a zonal bucket writes each shard larger than one
    message as a data object under a pointer, which only torchbucket reads;
    a copy gives every contender the same plain objects. Returns the bytes copied.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    copied = 0
    for name in emu.object_names(source, prefix):
        with opener.open(object_url(emu.endpoint, source, name), timeout=300) as resp:
            data = resp.read()
        emu.seed(target, {name: data})
        copied += len(data)
    return copied
