"""Configuration of small-object coalescing."""

from __future__ import annotations

from dataclasses import dataclass

from torchbucket.errors import ConfigError
from torchbucket.storage.base import COMPOSE_MAX_SOURCES, HIDDEN_PREFIXES

__all__ = ["COMPOSITE_PREFIX", "DEFAULT_MAX_COMPOSITE_OBJECT_SIZE", "ComposeConfig"]

#: Where composites are written. Listings skip it (``HIDDEN_PREFIXES``), and the
#: name is the one ``gcs-torch-dataflux`` uses, so one cleanup serves both.
COMPOSITE_PREFIX = HIDDEN_PREFIXES[0]

#: 4 MiB. Compose pays off for small objects only: it trades up to 32 GETs for
#: one compose, one GET and one delete, so it saves requests and client CPU, but
#: the composite then arrives over ONE connection. Under the emulator's
#: same-region model (20 ms to first byte, 200 MB/s per body), 4 MiB is 20 ms of
#: transfer, as long as the wait for the first byte, so a group never costs more
#: than about twice an object's latency; 32 x 10 KiB (320 KiB) or 32 x 100 KiB
#: (3.2 MiB) still fit a whole group of 32. Larger caps only lengthen the tail
#: (dataflux's 100 MB default makes one 100 MB GET of 0.5 s); objects larger than
#: the cap are fetched directly, which for them is faster anyway.
DEFAULT_MAX_COMPOSITE_OBJECT_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class ComposeConfig:
    """How small objects are coalesced into composites before download.

    Objects up to ``max_composite_object_size`` are grouped (in the order they
    are read, at most 32 per group, a group's total at most the cap), composed
    server-side into ``<composite_prefix><uuid>``, read with one GET, split back
    by their listed sizes, and the composite deleted. Larger objects, and groups
    of one, are read directly. The local filesystem (``file://``) never
    composes: a local read costs no round trip.

    Attributes:
        max_composite_object_size: Cap on a composite's size in bytes; ``0``
            turns coalescing off. Default 4 MiB (see
            :data:`DEFAULT_MAX_COMPOSITE_OBJECT_SIZE` for why).
        disable: Turn coalescing off; the same as a cap of ``0``. Default
            ``False``.
        max_sources: Objects per composite, 2 to 32 (the GCS limit). Default 32.
        composite_prefix: Where composites are written. Must lie under
            ``"dataflux-composed-objects/"`` so that listings skip it and
            ``torchbucket cleanup`` finds it; a sub-prefix per job lets a cleanup
            target one job. Default ``"dataflux-composed-objects/"``.
        throttle_cooldown: Seconds to read directly after a compose was
            throttled (429/503) before trying compose again. Default 30.
    """

    max_composite_object_size: int = DEFAULT_MAX_COMPOSITE_OBJECT_SIZE
    disable: bool = False
    max_sources: int = COMPOSE_MAX_SOURCES
    composite_prefix: str = COMPOSITE_PREFIX
    throttle_cooldown: float = 30.0

    def __post_init__(self) -> None:
        if self.max_composite_object_size < 0:
            raise ConfigError(
                "ComposeConfig.max_composite_object_size must be >= 0 (0 turns compose off), "
                f"got {self.max_composite_object_size!r}"
            )
        if not 2 <= self.max_sources <= COMPOSE_MAX_SOURCES:
            raise ConfigError(
                f"ComposeConfig.max_sources must be in 2..{COMPOSE_MAX_SOURCES}, "
                f"got {self.max_sources!r}"
            )
        if not self.composite_prefix.startswith(COMPOSITE_PREFIX) or not (
            self.composite_prefix.endswith("/")
        ):
            raise ConfigError(
                f"ComposeConfig.composite_prefix must start with {COMPOSITE_PREFIX!r} and end "
                f"with '/', got {self.composite_prefix!r}"
            )
        if self.throttle_cooldown < 0:
            raise ConfigError(
                f"ComposeConfig.throttle_cooldown must be >= 0, got {self.throttle_cooldown!r}"
            )

    @property
    def enabled(self) -> bool:
        """Whether coalescing is on."""
        return not self.disable and self.max_composite_object_size > 0
