"""torchbucket: feed PyTorch from cloud object storage and checkpoint into it.

The names users touch, re-exported here::

    from torchbucket import BucketMapDataset, BucketCheckpoint

Datasets and checkpoints import torch; they load on first use, so that
``import torchbucket`` (and the emulator process, which needs no torch) stays
light.
"""

import importlib as _importlib
import typing as _typing

from torchbucket._version import __version__
from torchbucket.config import ConcurrencyConfig, HedgeConfig, RetryConfig
from torchbucket.errors import (
    BucketNotFoundError,
    ConfigError,
    DeadlineExceededError,
    IntegrityError,
    InvalidURIError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    RetryableError,
    StorageError,
    ThrottledError,
    TorchBucketError,
    TransientError,
)
from torchbucket.runtime.budget import BudgetConfig
from torchbucket.storage import ObjectInfo, ObjectStore, store_for

if _typing.TYPE_CHECKING:
    from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
    from torchbucket.compose import ComposeConfig
    from torchbucket.datasets import (
        BucketBatchSampler,
        BucketIterableDataset,
        BucketMapDataset,
        FetchConfig,
        ShardingConfig,
    )
    from torchbucket.listing import ListingConfig, list_objects
    from torchbucket.shards import (
        BucketShardDataset,
        BucketShardMapDataset,
        PackConfig,
        ShardReadConfig,
    )
    from torchbucket.storage.gcs import GCSConfig

_LAZY = {
    "BucketBatchSampler": "torchbucket.datasets",
    "BucketCheckpoint": "torchbucket.checkpoint",
    "BucketIterableDataset": "torchbucket.datasets",
    "BucketMapDataset": "torchbucket.datasets",
    "BucketShardDataset": "torchbucket.shards",
    "BucketShardMapDataset": "torchbucket.shards",
    "CheckpointConfig": "torchbucket.checkpoint",
    "ComposeConfig": "torchbucket.compose",
    "FetchConfig": "torchbucket.datasets",
    "GCSConfig": "torchbucket.storage.gcs",
    "ListingConfig": "torchbucket.listing",
    "PackConfig": "torchbucket.shards",
    "ShardReadConfig": "torchbucket.shards",
    "ShardingConfig": "torchbucket.datasets",
    "list_objects": "torchbucket.listing",
}

__all__ = [
    "BucketBatchSampler",
    "BucketCheckpoint",
    "BucketIterableDataset",
    "BucketMapDataset",
    "BucketNotFoundError",
    "BucketShardDataset",
    "BucketShardMapDataset",
    "BudgetConfig",
    "CheckpointConfig",
    "ComposeConfig",
    "ConcurrencyConfig",
    "ConfigError",
    "DeadlineExceededError",
    "FetchConfig",
    "GCSConfig",
    "HedgeConfig",
    "IntegrityError",
    "InvalidURIError",
    "ListingConfig",
    "NotFoundError",
    "ObjectInfo",
    "ObjectStore",
    "PackConfig",
    "PermissionDeniedError",
    "PreconditionFailedError",
    "RetryConfig",
    "RetryableError",
    "ShardReadConfig",
    "ShardingConfig",
    "StorageError",
    "ThrottledError",
    "TorchBucketError",
    "TransientError",
    "__version__",
    "list_objects",
    "store_for",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchbucket' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
