"""The shard datasets check their arguments and name the sample a data_format_fn failed on, as the datasets do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from memory_helper import memory_bucket

from torchbucket.errors import ConfigError
from torchbucket.listing import ListingConfig
from torchbucket.shards import (
    BucketShardDataset,
    BucketShardMapDataset,
    PackConfig,
    ShardReadConfig,
    pack,
)

DATASETS = [BucketShardDataset, BucketShardMapDataset]


@pytest.fixture(scope="module")
def packed() -> Iterator[str]:
    objects = [(f"raw/{i:04d}.txt", f"text {i}".encode()) for i in range(4)]
    with memory_bucket("sharg", objects) as name:
        pack(
            f"memory://{name}/raw/", f"memory://{name}/packed/", config=PackConfig(), progress=False
        )
        yield f"memory://{name}/packed/"


@pytest.mark.parametrize("cls", DATASETS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"data_format_fn": "not a function"}, "data_format_fn"),
        ({"shard_read": ListingConfig()}, "shard_read"),
        ({"gcs": ShardReadConfig()}, "gcs"),
        ({"listing": ShardReadConfig()}, "listing"),
    ],
)
def test_from_prefix_names_a_wrong_argument(
    cls: Any, kw: dict[str, Any], named: str, packed: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        cls.from_prefix(packed, **kw)


def test_from_prefix_checks_before_listing() -> None:
    # The bucket does not exist: a NotFoundError would come from listing it.
    with pytest.raises(ConfigError, match=r"BucketShardDataset\.from_prefix: shard_read"):
        BucketShardDataset.from_prefix("memory://no-such-bucket-x/p/", shard_read=PackConfig())  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", DATASETS, ids=lambda c: c.__name__)
def test_the_constructor_wants_a_shard_set(cls: Any) -> None:
    with pytest.raises(ConfigError, match=r"shards.*from_prefix"):
        cls("memory://bucket/packed/")


def test_the_iterable_one_checks_sharding(packed: str) -> None:
    with pytest.raises(ConfigError, match="sharding"):
        BucketShardDataset.from_prefix(packed, sharding=ShardReadConfig())  # type: ignore[arg-type]


def _fails(sample: Any) -> Any:
    raise ValueError("cannot decode")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
@pytest.mark.parametrize("cls", DATASETS, ids=lambda c: c.__name__)
def test_a_failing_data_format_fn_names_the_sample(cls: Any, packed: str) -> None:
    ds = cls.from_prefix(packed, data_format_fn=_fails)
    with pytest.raises(ValueError, match="cannot decode") as caught:
        ds[0] if cls is BucketShardMapDataset else next(iter(ds))
    notes = getattr(caught.value, "__notes__", [])
    assert notes == [
        f"torchbucket: data_format_fn failed on sample '0000' of {packed}shard-000000.tar"
    ]
