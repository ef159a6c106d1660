"""The config rule: keyword-only config parameters named after their type.

The names before the rule (``gcs_config=``, ``listing_config=``, configs by
position) still work for one release, each with one ``FutureWarning`` per
process; option checks raise ``ConfigError``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from memory_helper import memory_bucket

from torchbucket import _checks
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.compose import plan_groups
from torchbucket.errors import ConfigError
from torchbucket.listing import list_objects
from torchbucket.storage.gcs import GCSConfig
from torchbucket.storage.ranges import split_ranges

GCS = GCSConfig(endpoint="http://127.0.0.1:1")


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # "Once per process": each test starts as a new process would.
    monkeypatch.setattr(_checks, "_WARNED", set())


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("config-names", [("d/a", b"a" * 10), ("d/b", b"b" * 20)]) as name:
        yield name


def _calls(
    fn: Callable[[], Any], times: int = 2
) -> tuple[list[Any], list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [fn() for _ in range(times)]
    return results, [w for w in caught if issubclass(w.category, FutureWarning)]


def test_gcs_config_still_works_and_warns_once() -> None:
    (first, second), caught = _calls(lambda: BucketCheckpoint(gcs_config=GCS))
    assert first.gcs is GCS and second.gcs is GCS
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "BucketCheckpoint" in message and "gcs_config=" in message and "gcs=" in message
    # The warning points at the caller, not at torchbucket.
    assert caught[0].filename == __file__


def test_positional_configs_still_work_and_warn_once() -> None:
    config = CheckpointConfig(part_size=8 << 20)
    (first, _), caught = _calls(lambda: BucketCheckpoint(config, GCS))  # type: ignore[misc]
    assert first.config is config and first.gcs is GCS
    assert len(caught) == 1
    assert "by position" in str(caught[0].message)
    assert "config=, gcs=" in str(caught[0].message)


def test_a_project_name_by_position_still_names_the_dataflux_class() -> None:
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="DatafluxCheckpoint"):
        BucketCheckpoint("my-project", "my-bucket")  # type: ignore[misc]


def test_old_and_new_name_together_is_an_error_naming_both() -> None:
    with pytest.raises(TypeError, match="gcs_config= and gcs="):
        BucketCheckpoint(gcs_config=GCS, gcs=GCS)  # type: ignore[call-arg]


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
