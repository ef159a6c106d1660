"""Argument checks shared by the public constructors.

A constructor checks what it was given when it is called, so that a string
where a config object belongs fails there, naming the parameter, rather than
as an ``AttributeError`` deep inside the first save or read.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Collection
from typing import Any, cast

from torchbucket.errors import ConfigError

__all__ = [
    "KINDS",
    "FieldCheck",
    "check_bool",
    "check_callable",
    "check_config",
    "check_instance",
    "check_int",
    "config_error",
    "count",
    "field_check",
    "in_flight",
    "nested",
    "number",
    "one_of",
    "seconds",
    "size",
    "switch",
    "text",
]


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


# -- Declared checks of config fields ---------------------------------------
#
# Every public config declares, per field, what it holds (``kind``) and what
# it accepts, through the field's default: ``prefetch_in_flight: int =
# in_flight(128)``. ``check_config`` in ``__post_init__`` runs them, so every
# config refuses a bad value with the same words ("FetchConfig.range_size
# must be a whole number of bytes >= 1, got 0") and like fields are equally
# strict (a bool is a bool everywhere). ``kind`` also carries the naming
# rule of docs/architecture.md ("Config vocabulary"), which
# tests/unit/test_config_names.py checks on every public config.

#: The kinds of fields: requests (or parts, pages, shards) at once; a number of
#: bytes; a number of things; an on/off or yes/no; a duration; another number;
#: one of fixed values; a string; a nested config; anything else.
KINDS = (
    "in_flight",
    "size",
    "count",
    "switch",
    "seconds",
    "number",
    "choice",
    "text",
    "config",
    "other",
)


@dataclasses.dataclass(frozen=True, slots=True)
class FieldCheck:
    """What one config field holds (``kind``) and accepts (``wanted``, ``accepts``)."""

    kind: str
    wanted: str
    accepts: Callable[[Any], bool]
    optional: bool = False

    def check(self, owner: str, name: str, value: Any) -> None:
        """Raise the field's ``ConfigError`` unless ``value`` is accepted.

        Raises:
            ConfigError: Naming ``owner.name``, what it must be and ``value``.
        """
        if value is None and self.optional:
            return
        if not self.accepts(value):
            wanted = self.wanted + (" or None" if self.optional else "")
            raise config_error(owner, name, value, wanted)


def config_error(owner: object, name: str, value: Any, wanted: str) -> ConfigError:
    """The error of a bad config field: ``Owner.name must be <wanted>, got <value>``.

    ``owner`` is the config (or its name). Checks across fields raise it too,
    with ``wanted`` naming the other field.
    """
    label = owner if isinstance(owner, str) else type(owner).__name__
    return ConfigError(f"{label}.{name} must be {wanted}, got {_shown(value)}")


def check_config(config: object) -> None:
    """Run the declared check of every field of the dataclass ``config``.

    Raises:
        ConfigError: The first field whose value its check refuses.
        TypeError: A field declares no check (a bug in torchbucket).
    """
    owner = type(config).__name__
    for item in dataclasses.fields(cast(Any, config)):
        declared = item.metadata.get("check")
        if not isinstance(declared, FieldCheck):
            raise TypeError(f"{owner}.{item.name} declares no check (see torchbucket._checks)")
        declared.check(owner, item.name, getattr(config, item.name))


def field_check(
    default: Any,
    *,
    kind: str,
    wanted: str,
    accepts: Callable[[Any], bool],
    optional: bool = False,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field whose default is ``default`` (or ``factory()``) and check as given."""
    if kind not in KINDS:
        raise ValueError(f"unknown field kind {kind!r}")
    metadata = {"check": FieldCheck(kind, wanted, accepts, optional)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _is_bool(value: Any) -> bool:
    kind = type(value)
    return isinstance(value, bool) or (
        kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not _is_bool(value) and not math.isnan(value)


def _bytes_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return str(n)


def _int_field(
    default: Any, kind: str, noun: str, minimum: int, maximum: int | None, optional: bool
) -> Any:
    wanted = f"{noun} >= {minimum}" if maximum is None else f"{noun} in {minimum}..{maximum}"
    return field_check(
        default,
        kind=kind,
        wanted=wanted,
        optional=optional,
        accepts=lambda v: _is_int(v) and v >= minimum and (maximum is None or v <= maximum),
    )


def in_flight(default: int, *, minimum: int = 1, maximum: int | None = None) -> Any:
    """A number of requests (parts, pages, reads, shards) at once: an int >= ``minimum``."""
    return _int_field(default, "in_flight", "an int", minimum, maximum, False)


def count(
    default: int | None, *, minimum: int = 1, maximum: int | None = None, optional: bool = False
) -> Any:
    """A number of things (objects, samples, epochs): an int >= ``minimum``."""
    return _int_field(default, "count", "an int", minimum, maximum, optional)


def size(
    default: int | None,
    *,
    minimum: int = 1,
    multiple_of: int | None = None,
    optional: bool = False,
) -> Any:
    """A number of bytes: an int >= ``minimum`` (a multiple of ``multiple_of``)."""
    wanted = f"a whole number of bytes >= {_bytes_text(minimum)}"
    if multiple_of is not None:
        wanted += f", a multiple of {_bytes_text(multiple_of)}"
    return field_check(
        default,
        kind="size",
        wanted=wanted,
        optional=optional,
        accepts=lambda v: (
            _is_int(v) and v >= minimum and (multiple_of is None or v % multiple_of == 0)
        ),
    )


def switch(default: bool) -> Any:
    """On or off, yes or no: ``True`` or ``False`` (NumPy's bools too), never a truthy value."""
    return field_check(default, kind="switch", wanted="True or False", accepts=_is_bool)


def seconds(default: float | None, *, positive: bool = False, optional: bool = False) -> Any:
    """A duration in seconds: a number ``>= 0`` (``> 0`` when ``positive``)."""
    if positive:
        return field_check(
            default,
            kind="seconds",
            wanted="a number of seconds > 0",
            optional=optional,
            accepts=lambda v: _is_real(v) and v > 0,
        )
    return field_check(
        default,
        kind="seconds",
        wanted="a number of seconds >= 0",
        optional=optional,
        accepts=lambda v: _is_real(v) and v >= 0,
    )


def number(
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> Any:
    """Another number: at least ``minimum``, at most ``maximum``, over ``above``, under ``below``."""
    low = f"[{minimum}" if minimum is not None else f"({above}" if above is not None else ""
    high = f"{maximum}]" if maximum is not None else f"{below})" if below is not None else ""
    if low and high:
        wanted = f"a number in {low}, {high}"
    elif low:
        wanted = f"a number {'>=' if minimum is not None else '>'} {low[1:]}"
    elif high:
        wanted = f"a number {'<=' if maximum is not None else '<'} {high[:-1]}"
    else:
        wanted = "a number"

    def accepts(v: Any) -> bool:
        return (
            _is_real(v)
            and (minimum is None or v >= minimum)
            and (maximum is None or v <= maximum)
            and (above is None or v > above)
            and (below is None or v < below)
        )

    return field_check(default, kind="number", wanted=wanted, accepts=accepts)


def one_of(default: Any, choices: Collection[Any]) -> Any:
    """One of ``choices`` (compared by type and value, so ``1`` is not ``True``)."""
    options = tuple(choices)
    shown = [repr(c) for c in options]
    wanted = " or ".join(shown) if len(shown) <= 2 else ", ".join(shown[:-1]) + " or " + shown[-1]

    def accepts(v: Any) -> bool:
        return any(type(v) is type(c) and v == c for c in options)

    return field_check(default, kind="choice", wanted=wanted, accepts=accepts)


def text(
    default: str | None,
    *,
    starts_with: tuple[str, ...] = (),
    ends_with: str = "",
    optional: bool = False,
) -> Any:
    """A string, starting with one of ``starts_with`` and ending with ``ends_with``."""
    wanted = "a string"
    if starts_with:
        wanted += " starting with " + " or ".join(repr(s) for s in starts_with)
    if ends_with:
        wanted += (" and" if starts_with else "") + f" ending with {ends_with!r}"
    return field_check(
        default,
        kind="text",
        wanted=wanted,
        optional=optional,
        accepts=lambda v: (
            isinstance(v, str)
            and (not starts_with or v.startswith(starts_with))
            and v.endswith(ends_with)
        ),
    )


def nested(config_type: type) -> Any:
    """A nested config of ``config_type``, by default ``config_type()``."""
    return field_check(
        None,
        kind="config",
        wanted=f"a {config_type.__name__}",
        accepts=lambda v: isinstance(v, config_type),
        factory=config_type,
    )
