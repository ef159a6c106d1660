"""Pack small objects into tar shards once; stream or index them every epoch.

::

    from torchbucket.shards import BucketShardDataset, pack

    pack("gs://bkt/raw/", "gs://bkt/packed/")           # or: torchbucket pack SRC DST
    train = BucketShardDataset.from_prefix("gs://bkt/packed/", shuffle=True, seed=17)

Shards are tar files in the WebDataset layout (``<key>.<ext>`` members, a
key's members adjacent), named ``shard-000000.tar``...; beside each, an index
(``shard-000000.idx.json``: member names, offsets, sizes, CRC32Cs), and one
``manifest.json`` for the set. Shards written elsewhere (``webdataset``'s
``ShardWriter``) are read too, by streaming their headers.
"""

from __future__ import annotations

from torchbucket.shards._iterable import BucketShardDataset
from torchbucket.shards._map import BucketShardMapDataset
from torchbucket.shards._pack import PackResult, apack, pack
from torchbucket.shards.config import PackConfig, ShardReadConfig

__all__ = [
    "BucketShardDataset",
    "BucketShardMapDataset",
    "PackConfig",
    "PackResult",
    "ShardReadConfig",
    "apack",
    "pack",
]
