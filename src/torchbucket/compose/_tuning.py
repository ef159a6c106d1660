"""Knobs of the compose path that tests and benchmarks turn: not user options.

They were ``ComposeConfig`` fields, but only tests and one benchmark ever set
them; a user's compose has them at these values. Each is read where it is
used, from :data:`TUNING`, so a test that patches an attribute
(``monkeypatch.setattr(TUNING, "anchor", False)``, or ``with tuned(...)``)
changes it in the DataLoader workers that fork starts too. A process started
by spawn (or any other) reads ``$TORCHBUCKET_COMPOSE_TUNING`` when it imports
this module, ``name=value`` pairs split by commas
(``anchor=0,read_around_after=0``); :func:`tuned` sets it for the children
started inside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV", "TUNING", "Tuning", "tuned"]

#: The environment variable a process reads its tuning from at import.
ENV = "TORCHBUCKET_COMPOSE_TUNING"


@dataclass
class Tuning:
    """The compose path's hidden knobs (see the module).

    Attributes:
        read_around_after: A group whose compose and composite read have
            taken this many times the median of the process's recent ones (at
            least ``read_around_floor``) is also read object by object, and
            whichever finishes first is used, unless its compose has answered
            (what is left, the composite's read, is hedged like any read);
            the compose goes on and its composite is deleted as usual. A
            compose is a write, never sent twice; this bounds what a
            straggling compose costs the window. The
            same bound sends a composite's delete again when it has taken this
            many times the median of recent deletes (at least
            ``read_around_floor``): the delete is pinned to the composite's
            generation, so the second finds it gone if the first went through.
            ``0`` turns both off. Default 4.
        read_around_floor: Seconds a group's compose path (or a composite's
            delete, or a window's anchor upload) may always take before it is
            read around (sent again, gone on without). Default 0.25.
        read_around_needed_after: The ``read_around_after`` of a group its
            consumer is already waiting for (the head of a prefetch window):
            waiting for it overlaps no other work, so it pays to give up on it
            sooner. ``0`` turns it off. Default 2.
        read_around_needed_floor: Seconds a waited-for group's compose path
            may always take before it is read around. Default 0.1.
        anchor: A dataset's prefetch window uploads an empty object under the
            composite prefix, names it as the first source of each of its
            composes (groups hold ``max_sources - 1`` objects) and deletes it
            at the window's end, which revokes any compose not yet applied, so
            an epoch does not wait for a compose left running after its group
            was read around. One class A upload and one free delete per window
            and bucket. Default ``True``.
    """

    read_around_after: float = 4.0
    read_around_floor: float = 0.25
    read_around_needed_after: float = 2.0
    read_around_needed_floor: float = 0.1
    anchor: bool = True

    def update(self, **values: Any) -> None:
        """Set fields by name, each checked as its default's type.

        Raises:
            ValueError: An unknown name, or a value not of the field's kind.
        """
        known = {f.name: f for f in dataclasses.fields(self)}
        for name, value in values.items():
            if name not in known:
                raise ValueError(f"compose tuning has no {name!r} (known: {sorted(known)})")
            if name == "anchor":
                if not isinstance(value, bool):
                    raise ValueError(f"compose tuning anchor must be a bool, got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value >= 0)
            ):
                raise ValueError(f"compose tuning {name} must be a number >= 0, got {value!r}")
            setattr(self, name, value)


def _parse(text: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"${ENV}: {item!r} is not name=value")
        name = name.strip()
        raw = raw.strip()
        values[name] = raw.lower() in ("1", "true", "yes") if name == "anchor" else float(raw)
    return values


def _text(values: dict[str, Any]) -> str:
    return ",".join(
        f"{k}={int(v) if isinstance(v, bool) else v!r}" for k, v in sorted(values.items())
    )


#: The process's tuning: defaults, then ``$TORCHBUCKET_COMPOSE_TUNING``.
TUNING = Tuning()
TUNING.update(**_parse(os.environ.get(ENV, "")))


@contextlib.contextmanager
def tuned(**values: Any) -> Iterator[Tuning]:
    """Within the block, :data:`TUNING` has ``values`` (and so do processes started in it).

    Raises:
        ValueError: As :meth:`Tuning.update`.
    """
    saved = dataclasses.asdict(TUNING)
    saved_env = os.environ.get(ENV)
    TUNING.update(**values)
    merged = {**_parse(saved_env or ""), **values}
    os.environ[ENV] = _text(merged)
    try:
        yield TUNING
    finally:
        TUNING.update(**saved)
        if saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved_env
