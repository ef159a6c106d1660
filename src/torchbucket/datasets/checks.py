"""Argument checks of the dataset constructors, shared with the shard datasets.

A wrong argument (a ``ListingConfig`` passed as ``fetch``, a string as
``data_format_fn``) fails where it is given, naming the constructor and the
parameter, before anything is listed or read.
"""

from __future__ import annotations

from typing import Any

from torchbucket._checks import check_callable, check_instance
from torchbucket.storage.checks import check_gcs_config

__all__ = ["check_configs", "check_source_arguments"]


def check_configs(
    owner: str, data_format_fn: Any = None, **configs: tuple[Any, type | tuple[type, ...]]
) -> None:
    """Check ``data_format_fn`` (callable or ``None``) and each ``name=(value, type)``.

    Raises:
        ConfigError: An argument is not of its type, naming ``owner`` and it.
    """
    check_callable(data_format_fn, owner=owner, parameter="data_format_fn")
    for parameter, (value, expected) in configs.items():
        check_instance(value, expected, owner=owner, parameter=parameter)


def check_source_arguments(
    owner: str, gcs: Any, listing: Any = None, **configs: tuple[Any, type]
) -> None:
    """Check ``from_prefix`` / ``from_objects`` arguments before anything is listed.

    ``configs`` maps a parameter's name to ``(value, type)``.

    Raises:
        ConfigError: An argument is not of its type, naming it.
    """
    from torchbucket.listing import ListingConfig

    check_gcs_config(gcs, owner=owner)
    check_instance(listing, ListingConfig, owner=owner, parameter="listing")
    for parameter, (value, expected) in configs.items():
        check_instance(value, expected, owner=owner, parameter=parameter)
