"""The progress bar of ``pack``: bytes packed, on stderr when asked or on a terminal."""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["Progress"]


class Progress:
    """A bar of bytes on stderr, or nothing."""

    def __init__(self, choice: bool | Literal["auto"], total: int, desc: str) -> None:
        import sys

        show = choice is True or (choice == "auto" and sys.stderr.isatty())
        self._bar: Any = None
        if show:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=sys.stderr,
            )

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
