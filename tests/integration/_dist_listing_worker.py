"""One rank of the torchrun listing test (launched by test_listing_torchrun.py).

Usage: ``torchrun --nproc_per_node 2 _dist_listing_worker.py ENDPOINT BUCKET OUT_DIR``.
Each rank lists ``gs://BUCKET/data/`` three times through a store that counts
its list requests: with the default config (rank 0 lists and broadcasts), with
a page failing on rank 0 (every rank must fail alike), and with
``broadcast=False`` (every rank lists). It writes what it saw to
``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from torchbucket import runtime
from torchbucket.config import RetryConfig
from torchbucket.errors import PermissionDeniedError, StorageError
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.storage.base import ListPage
from torchbucket.storage.gcs import GCSConfig, GCSStore


class Counting:
    """A store that counts list requests and can refuse them."""

    def __init__(self, inner: GCSStore) -> None:
        self.inner = inner
        self.calls = 0
        self.refuse = False

    @property
    def bucket(self) -> str:
        return self.inner.bucket

    def uri(self, key: str = "") -> str:
        return self.inner.uri(key)

    async def list_page(self, prefix: str = "", **kw: Any) -> ListPage:
        self.calls += 1
        if self.refuse:
            raise PermissionDeniedError(
                "refused", operation="list", uri=self.uri(prefix), status=403
            )
        return await self.inner.list_page(prefix, **kw)


def main() -> None:
    endpoint, bucket, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = GCSConfig(endpoint=endpoint, anonymous=True, retry=RetryConfig(deadline=30.0))
    store = Counting(GCSStore(bucket, config=config))
    listing = ListingConfig(progress=False, objects_per_page=100)
    report: dict[str, Any] = {}

    objects = runtime.run(alist_objects(store, "data/", config=listing))
    report["names"] = [o.name for o in objects]
    report["infos"] = [[o.size, o.generation, o.crc32c, o.storage_class] for o in objects]
    report["calls"] = store.calls

    store.calls = 0
    store.refuse = rank == 0
    try:
        runtime.run(alist_objects(store, "data/", config=listing))
        report["error"] = None
    except StorageError as exc:
        report["error"] = [type(exc).__name__, exc.uri]
    report["calls_failing"] = store.calls

    store.calls = 0
    store.refuse = False
    alone = ListingConfig(progress=False, objects_per_page=100, broadcast=False)
    report["alone"] = len(runtime.run(alist_objects(store, "data/", config=alone)))
    report["calls_alone"] = store.calls

    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    runtime.run(store.inner.close())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
