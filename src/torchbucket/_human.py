"""Counts and sizes written for people: one place for the CLI and the demo."""

from __future__ import annotations

__all__ = ["human_bytes", "plural"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def plural(count: int, noun: str) -> str:
    """``plural(1, "object")`` -> ``"1 object"``; ``plural(2, "object")`` -> ``"2 objects"``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def human_bytes(size: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: binary units, three significant figures, at most four digits.

    A value that three significant figures would round to 1000 or more (999.5
    to 1023.99 of a unit) is written whole (``"1000 MiB"``), where ``%.3g``
    would write ``"1e+03"``.
    """
    value = float(size)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.0f} {unit}" if abs(value) >= 999.5 else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
