"""The config rule: keyword-only config parameters named after their type.

The names before the rule (``gcs_config=``, ``listing_config=``, configs by
position) are gone: nothing was published under them. Option checks raise
``ConfigError``.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.compose import plan_groups
from torchbucket.errors import ConfigError
from torchbucket.listing import list_objects
from torchbucket.storage.gcs import GCSConfig
from torchbucket.storage.ranges import split_ranges

GCS = GCSConfig(endpoint="http://127.0.0.1:1")


def test_the_names_before_the_rule_are_gone() -> None:
    with pytest.raises(TypeError, match="gcs_config"):
        BucketCheckpoint(gcs_config=GCS)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        BucketCheckpoint(CheckpointConfig(), GCS)  # type: ignore[misc]
    with pytest.raises(TypeError, match="gcs_config"):
        list_objects("memory://b/p/", gcs_config=GCS)  # type: ignore[call-arg]


def test_config_parameters_are_keyword_only_and_named_after_their_type() -> None:
    from torchbucket.datasets import BucketIterableDataset, BucketMapDataset
    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
    from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO
    from torchbucket.shards import BucketShardDataset, BucketShardMapDataset, apack, pack

    for fn in (
        BucketCheckpoint,
        BucketCheckpointIO,
        AsyncBucketCheckpointIO,
        BucketStorageWriter,
        BucketStorageReader,
        BucketMapDataset.from_prefix,
        BucketMapDataset.from_objects,
        BucketIterableDataset.from_prefix,
        BucketIterableDataset.from_objects,
        BucketShardDataset.from_prefix,
        BucketShardMapDataset.from_prefix,
        list_objects,
        pack,
        apack,
    ):
        parameters = inspect.signature(fn).parameters
        assert "gcs_config" not in parameters and "listing_config" not in parameters, fn
        for name in (
            "config",
            "gcs",
            "listing",
            "compose",
            "fetch",
            "sharding",
            "read",
            "checkpoint",
            "bucket_checkpoint",
        ):
            if name in parameters:
                assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, (fn, name)


@pytest.mark.parametrize(
    "given",
    [
        {"checkpoint": CheckpointConfig()},
        {"gcs": GCS},
        {"checkpoint": CheckpointConfig(), "gcs": GCS},
    ],
)
def test_a_bucket_checkpoint_with_a_config_is_an_error_never_an_override(
    given: dict[str, Any],
) -> None:
    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
    from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO

    ready = BucketCheckpoint()
    for make in (
        lambda **kw: BucketStorageWriter("memory://b/run", **kw),
        lambda **kw: BucketStorageReader("memory://b/run", **kw),
        BucketCheckpointIO,
        AsyncBucketCheckpointIO,
    ):
        with pytest.raises(ConfigError, match="bucket_checkpoint= was given with") as caught:
            make(bucket_checkpoint=ready, **given)
        assert all(f"{name}=" in str(caught.value) for name in given)
    # A BucketCheckpoint where its config belongs says where it goes.
    with pytest.raises(ConfigError, match="goes as bucket_checkpoint="):
        BucketCheckpointIO(checkpoint=ready)  # type: ignore[arg-type]


def test_option_checks_raise_config_error() -> None:
    from torchbucket.dcp import merge_ranges

    with pytest.raises(ConfigError, match="max_sources"):
        plan_groups([1, 2], max_composite_object_size=10, max_sources=0)
    with pytest.raises(ConfigError, match="max_gap"):
        merge_ranges([(0, 1)], max_gap=-1)
    with pytest.raises(ConfigError, match="chunk"):
        split_ranges(10, 0)
