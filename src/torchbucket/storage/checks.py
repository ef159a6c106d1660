"""Argument checks for the storage layer's types, for the constructors above it.

A ``GCSConfig`` is checked where it is given, naming the parameter, and
``torchbucket.storage.gcs`` (and with it aiohttp) is imported only when one is
given: a ``memory://`` dataset never loads it.
"""

from __future__ import annotations

from typing import Any

from torchbucket._checks import check_instance

__all__ = ["check_gcs_config"]


def check_gcs_config(value: Any, *, owner: str, parameter: str = "gcs") -> None:
    """:func:`~torchbucket._checks.check_instance` for a ``GCSConfig`` (or ``None``).

    Raises:
        ConfigError: ``value`` is neither, naming ``owner`` and ``parameter``.
    """
    if value is None:
        return
    from torchbucket.storage.gcs import GCSConfig

    check_instance(value, GCSConfig, owner=owner, parameter=parameter)
