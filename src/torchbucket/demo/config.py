"""What the demo does: :class:`DemoConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from torchbucket.errors import ConfigError

__all__ = ["DemoConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoConfig:
    """What the demo does.

    Attributes:
        objects: Images generated, a sixth of them held out. Default 20,000.
        epochs: Epochs in all, over both jobs (at least one before and one
            after the restart). Default 3.
        restart_after: Epochs the first job trains before it "crashes"; the
            restarted job trains the rest. Default ``None``: ``epochs - 1``.
        workers: DataLoader worker processes. Default 2.
        batch_size: Images per batch. Default 64.
        out: Folder for the figure and ``summary.json``. Default ``demo-output``.
        bucket: ``gs://bucket/prefix`` to use instead of the local emulator.
            Default ``None``: the emulator.
        endpoint: GCS endpoint for ``bucket`` (``--endpoint``). Default
            ``None``: ``$STORAGE_EMULATOR_HOST``, else Google's.
        latency: Model a same-region bucket's latency in the emulator. Default
            ``True``.
        seed: Picks the images and the initial weights. Default 0.
        compose: Coalesce small reads server-side (``ComposeConfig()``).
            Default ``False``, the map-style dataset's own default: it cannot
            hide the compose round trip on a batch's critical path, so it reads
            each image with its own GET (see ``ComposeConfig``).
        learning_rate: Adam's learning rate. Default 3e-3.
    """

    objects: int = 20_000
    epochs: int = 3
    restart_after: int | None = None
    workers: int = 2
    batch_size: int = 64
    out: str = "demo-output"
    bucket: str | None = None
    endpoint: str | None = None
    latency: bool = True
    seed: int = 0
    compose: bool = False
    learning_rate: float = 3e-3

    def __post_init__(self) -> None:
        # The demo is written as a user would (tests/unit/test_layering.py), so
        # it checks its options itself, in the words of the library's checks.
        for name, minimum in (("objects", 12), ("epochs", 2), ("workers", 0), ("batch_size", 1)):
            _at_least(name, getattr(self, name), minimum)
        if self.restart_after is not None:
            _at_least("restart_after", self.restart_after, 1)
            if self.restart_after >= self.epochs:
                _refuse("restart_after", self.restart_after, f"< epochs ({self.epochs})")
        for name in ("latency", "compose"):
            if not isinstance(getattr(self, name), bool):
                _refuse(name, getattr(self, name), "True or False")
        if self.bucket is not None and not str(self.bucket).startswith("gs://"):
            _refuse("bucket", self.bucket, "a gs:// URI (--bucket) or None")

    @property
    def first_job_epochs(self) -> int:
        """Epochs trained before the restart."""
        return self.restart_after if self.restart_after is not None else self.epochs - 1


def _refuse(name: str, value: Any, wanted: str) -> NoReturn:
    raise ConfigError(f"DemoConfig.{name} must be {wanted}, got {value!r}")


def _at_least(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _refuse(name, value, f"an int >= {minimum}")
