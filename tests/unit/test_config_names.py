"""The config rules (docs/architecture.md, "Config vocabulary").

Keyword-only config parameters named after their type; the names before the
rule (``gcs_config=``, ``listing_config=``, configs by position) are gone:
nothing was published under them. Every field of every public config declares
its check (``torchbucket._checks``) and its kind, and its name follows the
vocabulary: ``*_in_flight`` for requests at once, ``*_size`` for bytes,
``enabled`` (never a negative name) for switches.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from typing import Any

import pytest

import torchbucket
from torchbucket._checks import KINDS, FieldCheck
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
            "shard_read",
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


# -- The vocabulary, on every public config ----------------------------------

# The dataflux-compatible API keeps dataflux's names (a real external API).
_OWN_NAMES = ("torchbucket.dataflux",)
# PyTorch's own names (DataLoader's samples per batch, torch.distributed's
# ranks), not bytes.
_NOT_BYTES = {("DemoConfig", "batch_size"), ("ShardingConfig", "world_size")}
# Bools say what True does: never "disable_x", "no_x", "skip_x".
_NEGATIVE = re.compile(r"^(disable|disabled|no|not|skip|without|dont)(_|$)")


def _public_modules() -> list[Any]:
    found = []
    for info in pkgutil.walk_packages(torchbucket.__path__, "torchbucket."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts[1:]) or info.name.startswith(_OWN_NAMES):
            continue
        if info.name.startswith("torchbucket.emulator.") or info.name.endswith("__main__"):
            continue
        found.append(importlib.import_module(info.name))
    return found


def _public_configs() -> list[type]:
    configs: dict[str, type] = {}
    for module in _public_modules():
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and name.endswith("Config")
                and dataclasses.is_dataclass(value)
                and value.__module__.startswith("torchbucket")
                and not value.__module__.startswith(_OWN_NAMES)
            ):
                configs[name] = value
    return [configs[n] for n in sorted(configs)]


CONFIGS = _public_configs()


def test_every_public_config_is_checked_here() -> None:
    assert {c.__name__ for c in CONFIGS} >= {
        "BudgetConfig",
        "CheckpointConfig",
        "ComposeConfig",
        "ConcurrencyConfig",
        "DemoConfig",
        "FetchConfig",
        "GCSConfig",
        "HedgeConfig",
        "ListingConfig",
        "PackConfig",
        "RetryConfig",
        "ShardReadConfig",
        "ShardingConfig",
    }


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_config_fields_follow_the_vocabulary(config: type) -> None:
    wrong = []
    for item in dataclasses.fields(config):
        name, owner = item.name, config.__name__
        declared = item.metadata.get("check")
        # The demo is a user of the library (no private imports): its fields
        # are checked by name and annotation alone.
        if config.__module__ != "torchbucket.demo.config" and (
            not isinstance(declared, FieldCheck) or declared.kind not in KINDS
        ):
            wrong.append(f"{owner}.{name} declares no check")
            continue
        kind = declared.kind if isinstance(declared, FieldCheck) else None
        is_bool = kind == "switch" or str(item.type).startswith("bool")
        if name.endswith("_in_flight") != (kind == "in_flight") and kind is not None:
            wrong.append(f"{owner}.{name}: requests at once are *_in_flight, and only they")
        if (
            (owner, name) not in _NOT_BYTES
            and kind is not None
            and name.endswith("_size") != (kind == "size")
        ):
            wrong.append(f"{owner}.{name}: bytes are *_size, and only bytes")
        if kind is None and (owner, name) not in _NOT_BYTES and name.endswith("_size"):
            wrong.append(f"{owner}.{name}: *_size is bytes")
        if is_bool and _NEGATIVE.match(name):
            wrong.append(f"{owner}.{name}: a switch says what True does (enabled=, not disable=)")
    assert wrong == []


def _bad_values(declared: FieldCheck) -> list[Any]:
    values: list[Any] = [object()]
    if declared.kind == "switch":
        values += [1, "yes"]  # a bool is a bool everywhere
    if declared.kind in ("in_flight", "size", "count"):
        values += [True, 1.5, "8"]
    return values


@pytest.mark.parametrize(
    "config", [c for c in CONFIGS if c.__name__ != "DemoConfig"], ids=lambda c: c.__name__
)
def test_every_field_is_refused_in_the_same_words(config: type) -> None:
    for item in dataclasses.fields(config):
        declared = item.metadata["check"]
        for value in _bad_values(declared):
            with pytest.raises(ConfigError) as caught:
                config(**{item.name: value})
            assert str(caught.value).startswith(f"{config.__name__}.{item.name} must be "), (
                caught.value
            )
            assert ", got " in str(caught.value)


def _callables() -> list[tuple[str, Any]]:
    found: dict[str, Any] = {}
    for module in _public_modules():
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if getattr(value, "__module__", "").startswith(_OWN_NAMES):
                continue
            if inspect.isclass(value):
                for attr, member in vars(value).items():
                    if attr == "__init__" or not attr.startswith("_"):
                        fn = member.__func__ if isinstance(member, classmethod) else member
                        if inspect.isfunction(fn):
                            found[f"{value.__qualname__}.{attr}"] = fn
            elif inspect.isfunction(value):
                found[f"{module.__name__}.{name}"] = value
    return sorted(found.items())


def _snake(config_name: str) -> str:
    stem = config_name.removesuffix("Config")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem).lower()


def test_config_parameters_are_named_after_their_type_everywhere() -> None:
    wrong = []
    for where, fn in _callables():
        for parameter in inspect.signature(fn).parameters.values():
            annotation = str(parameter.annotation)
            types = set(re.findall(r"\b([A-Z][A-Za-z]*Config)\b", annotation))
            if not types or parameter.name == "config":
                continue
            allowed = {_snake(t) for t in types}
            if parameter.name not in allowed:
                wrong.append(f"{where}({parameter.name}: {annotation}) wants {sorted(allowed)}")
    assert wrong == []


def test_classes_that_are_not_the_checkpoint_take_no_config_parameter() -> None:
    from torchbucket.dcp import BucketStorageReader, BucketStorageWriter
    from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO

    for cls in (
        BucketStorageReader,
        BucketStorageWriter,
        BucketCheckpointIO,
        AsyncBucketCheckpointIO,
    ):
        parameters = inspect.signature(cls).parameters
        assert "config" not in parameters and "checkpoint" in parameters, cls
