"""Configuration of small-object coalescing."""

from __future__ import annotations

from dataclasses import dataclass

from torchbucket._checks import check_config, count, seconds, size, switch, text
from torchbucket.storage.base import COMPOSE_MAX_SOURCES, HIDDEN_PREFIXES

__all__ = ["COMPOSITE_PREFIX", "DEFAULT_MAX_COMPOSITE_OBJECT_SIZE", "ComposeConfig"]

#: Where composites are written. Listings skip it (``HIDDEN_PREFIXES``), and the
#: name is the one ``gcs-torch-dataflux`` uses, so one cleanup serves both.
COMPOSITE_PREFIX = HIDDEN_PREFIXES[0]

#: 4 MiB, by measurement. Compose pays off for small objects: it trades up to 32
#: GETs for one compose, one GET and one delete, which saves requests and client
#: CPU, but a composite then arrives over ONE connection. 4 MiB is the smallest
#: cap that still makes full groups of 32 for objects up to 128 KiB. Measured on
#: the emulator's same-region model (DataLoader, 2 workers, 2,000 x 100 KiB): a
#: 1 MiB cap (groups of 10) cost 0.44 ms of client CPU per object, 4 MiB (groups
#: of 32) 0.35 ms, at the same throughput; a larger cap changes nothing for such
#: objects and, for larger ones, only lengthens one composite's single-stream
#: transfer (dataflux's 100 MB default makes a 0.5 s GET at 200 MB/s). Objects
#: larger than the cap are read directly, which for them is as fast.
DEFAULT_MAX_COMPOSITE_OBJECT_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class ComposeConfig:
    """How small objects are coalesced into composites before download.

    Objects up to ``max_composite_object_size`` are grouped (in the order they
    are read, at most ``max_sources`` per group, 31 in a dataset's prefetch
    window, whose anchor takes a source; a group's total at most the cap), composed
    server-side into ``<composite_prefix><uuid>``, read with one GET, split back
    by their listed sizes, and the composite deleted. Larger objects, and groups
    of one, are read directly. The local filesystem (``file://``) never
    composes: a local read costs no round trip.

    Which dataset composes by default (the measurements behind each are in
    docs/benchmarks.md):

    - :class:`~torchbucket.datasets.BucketIterableDataset` composes: its
      prefetch window keeps enough groups in flight to hide the compose
      round trip (and reads its first objects directly, so the first batch
      does not wait for one), so for small objects compose is faster than
      direct reads and costs less client CPU and fewer requests.
    - :class:`~torchbucket.datasets.BucketMapDataset` reads ahead across
      batches and composes, as the iterable dataset does, with a
      :class:`~torchbucket.datasets.BucketBatchSampler` or with torch's own
      samplers (``DataLoader(shuffle=True)`` or ``False``,
      ``DistributedSampler``), whose order it takes as an epoch starts.
    - With any other sampler it reads batch at a time and directly: a batch
      cannot start composing before the DataLoader asks for it, so the
      compose round trip would add to every batch's latency. Turn it on
      (``compose=ComposeConfig()``) where the loader is not the bottleneck
      and requests or client CPU matter more.

    Request cost: GCS bills a compose as a class A operation (12.5x a class
    B GET at Standard-class list prices; deletes are free), so a group of 32
    objects costs a compose and a GET where direct reads cost 32 GETs;
    ``torchbucket cost`` prices a dataset both ways.

    Attributes:
        enabled: Coalesce at all. Default ``True`` (the map-style dataset
            batch at a time uses ``ComposeConfig(enabled=False)`` unless given
            one).
        max_composite_object_size: Cap on a composite's size in bytes, at
            least 1. Default 4 MiB (see
            :data:`DEFAULT_MAX_COMPOSITE_OBJECT_SIZE` for the measurement).
        max_sources: Sources per compose, 2 to 32 (the GCS limit). Default 32
            (a prefetch window's composes name its anchor first: 31 objects).
        composite_prefix: Where composites are written. Must lie under
            ``"dataflux-composed-objects/"`` so that listings skip it and
            ``torchbucket cleanup`` finds it; a sub-prefix per job lets a cleanup
            target one job. Default ``"dataflux-composed-objects/"``.
        throttle_cooldown: Seconds to read directly after a compose was
            throttled (429/503) before trying compose again. Default 30.
        allow_with_soft_delete: Compose even on a bucket with soft delete on.
            Default ``False``: such a bucket keeps every deleted composite,
            billed as storage for the retention window (7 days by default),
            so compose is off there, with one INFO line saying so; the policy
            is read once per process and bucket (one class B request).
            ``torchbucket cost`` shows what composing there would cost.
    """

    enabled: bool = switch(True)
    max_composite_object_size: int = size(DEFAULT_MAX_COMPOSITE_OBJECT_SIZE)
    max_sources: int = count(COMPOSE_MAX_SOURCES, minimum=2, maximum=COMPOSE_MAX_SOURCES)
    composite_prefix: str = text(COMPOSITE_PREFIX, starts_with=(COMPOSITE_PREFIX,), ends_with="/")
    throttle_cooldown: float = seconds(30.0)
    allow_with_soft_delete: bool = switch(False)

    def __post_init__(self) -> None:
        check_config(self)
