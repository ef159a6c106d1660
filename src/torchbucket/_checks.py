"""Argument checks shared by the public constructors.

A constructor checks what it was given when it is called, so that a string
where a config object belongs fails there, naming the parameter, rather than
as an ``AttributeError`` deep inside the first save or read.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

from torchbucket.errors import ConfigError

__all__ = ["check_bool", "check_callable", "check_instance", "check_int", "renamed_configs"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# (owner, old name) pairs already warned about: each warns once per process.
_WARNED: set[tuple[str, str]] = set()


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


def check_bool(value: Any, *, owner: str, parameter: str) -> None:
    """Raise unless ``value`` is a ``bool`` (NumPy's included).

    Why: a flag given as a string was taken for its truth, so ``shuffle="no"``
    shuffled; ``shuffle="yes"`` looked as if it were understood.

    Raises:
        ConfigError: Naming ``owner`` and ``parameter``.
    """
    kind = type(value)
    if isinstance(value, bool) or (
        kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")
    ):
        return
    raise ConfigError(
        f"{owner}: {parameter} must be True or False, got {type(value).__name__} {_shown(value)}"
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


def _warn_once(owner: str, old: str, message: str) -> None:
    if (owner, old) in _WARNED:
        return
    _WARNED.add((owner, old))
    # FutureWarning, not DeprecationWarning: Python shows it by default
    # wherever the call is, so the training script's author sees it; a
    # DeprecationWarning is hidden unless the call is in ``__main__``.
    # stacklevel 4: warnings.warn <- _warn_once <- the wrapper <- the caller.
    warnings.warn(message, FutureWarning, stacklevel=4)


def renamed_configs(
    *, positional: tuple[str, ...] = (), **renamed: str
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Accept, for one release, the config parameters a signature had before.

    The config rule (README, "Configuration") made config parameters
    keyword-only and named them after their type (``gcs=``, ``listing=``).
    The decorated function keeps the old spellings working, each with a
    ``FutureWarning`` once per process: ``renamed`` maps an old keyword to
    its new name, and ``positional`` names, in order, the parameters that
    used to be passed by position after the fixed positional ones.

    Raises:
        TypeError: An old and a new name were both given, or more positional
            arguments than the old signature had.
    """

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        owner = fn.__qualname__.removesuffix(".__init__")
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        fixed = sum(p.kind in kinds for p in inspect.signature(fn).parameters.values())

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> _R:
            if len(args) > fixed and positional:
                extra = args[fixed:]
                if len(extra) > len(positional):
                    raise TypeError(
                        f"{owner}() takes at most {len(positional)} configs by position "
                        f"({', '.join(positional)}), got {len(extra)}"
                    )
                names = positional[: len(extra)]
                _warn_once(
                    owner,
                    "*positional",
                    f"{owner}(): passing {', '.join(names)} by position is deprecated and "
                    f"will be removed in the next release; pass "
                    f"{', '.join(n + '=' for n in names)} by keyword",
                )
                for name, value in zip(names, extra, strict=True):
                    if name in kwargs:
                        raise TypeError(f"{owner}() got multiple values for {name}")
                    kwargs[name] = value
                args = args[:fixed]
            for old, new in renamed.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{owner}() got both {old}= and {new}=; pass only {new}=")
                _warn_once(
                    owner,
                    old,
                    f"{owner}(): {old}= is deprecated and will be removed in the next "
                    f"release; pass {new}=",
                )
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(Callable[_P, _R], wrapper)

    return decorate
