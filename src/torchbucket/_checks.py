"""Argument checks shared by the public constructors.

A constructor checks what it was given when it is called, so that a string
where a config object belongs fails there, naming the parameter, rather than
as an ``AttributeError`` deep inside the first save or read.
"""

from __future__ import annotations

from typing import Any

from torchbucket.errors import ConfigError

__all__ = ["check_callable", "check_instance", "check_int"]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_instance(
    value: Any,
    expected: type | tuple[type, ...],
    *,
    owner: str,
    parameter: str,
    optional: bool = True,
    hint: str = "",
) -> None:
    """Raise unless ``value`` is an ``expected`` (or ``None`` when ``optional``).

    Raises:
        ConfigError: Naming ``owner``, ``parameter``, the type wanted and the
            value given, followed by ``hint``.
    """
    if value is None and optional:
        return
    if isinstance(value, expected):
        return
    types = expected if isinstance(expected, tuple) else (expected,)
    wanted = " or ".join(t.__name__ for t in types) + (" or None" if optional else "")
    message = f"{owner}: {parameter} must be a {wanted}, got {type(value).__name__} {_shown(value)}"
    raise ConfigError(message + (f" ({hint})" if hint else ""))


def check_callable(value: Any, *, owner: str, parameter: str) -> None:
    """Raise unless ``value`` is ``None`` or callable.

    Raises:
        ConfigError: Naming ``owner`` and ``parameter``.
    """
    if value is not None and not callable(value):
        raise ConfigError(
            f"{owner}: {parameter} must be callable or None, "
            f"got {type(value).__name__} {_shown(value)}"
        )


def check_int(value: Any, *, owner: str, parameter: str, minimum: int) -> None:
    """Raise unless ``value`` is an ``int`` (not a ``bool``) of at least ``minimum``.

    Raises:
        ConfigError: Naming ``owner`` and ``parameter``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{owner}: {parameter} must be an int, got {type(value).__name__} {_shown(value)}"
        )
    if value < minimum:
        raise ConfigError(f"{owner}: {parameter} must be >= {minimum}, got {value!r}")
