"""PyTorch datasets over a bucket: map-style and iterable.

::

    from torchbucket.datasets import BucketMapDataset, BucketIterableDataset

    train = BucketIterableDataset.from_prefix(
        "gs://my-bucket/train/", data_format_fn=decode, shuffle=True, seed=17
    )
    loader = DataLoader(train, batch_size=64, num_workers=4)
    for epoch in range(10):
        train.set_epoch(epoch)
        for batch in loader:
            ...

A map-style dataset reads ahead across batches when the DataLoader's batches
come from a ``BucketBatchSampler`` made for it::

    train = BucketMapDataset.from_prefix("gs://my-bucket/train/", data_format_fn=decode)
    sampler = BucketBatchSampler(train, batch_size=64, seed=17)
    loader = DataLoader(train, batch_sampler=sampler, num_workers=4)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...

Samples of a MiB or more pass from DataLoader workers to the main process
without a copy when received as tensors on shared memory; objects of 8 MiB or
more are read with parallel ranged GETs::

    train = BucketMapDataset.from_prefix(
        "gs://my-bucket/clips/", fetch=FetchConfig(output="tensor")
    )
    loader = DataLoader(train, batch_size=16, num_workers=4, collate_fn=collate_list)

An empty prefix raises ``NotFoundError`` (a ``FileNotFoundError``) naming the
URI; an empty list of objects raises ``ConfigError`` (a ``ValueError``).
"""

from __future__ import annotations

from torchbucket.datasets._iterable import BucketIterableDataset
from torchbucket.datasets._map import BucketMapDataset
from torchbucket.datasets._receive import collate_list
from torchbucket.datasets._sampler import BucketBatchSampler
from torchbucket.datasets.config import FetchConfig, ShardingConfig

__all__ = [
    "BucketBatchSampler",
    "BucketIterableDataset",
    "BucketMapDataset",
    "FetchConfig",
    "ShardingConfig",
    "collate_list",
]
