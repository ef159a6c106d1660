"""Configuration of small-object coalescing."""

from __future__ import annotations

from dataclasses import dataclass

from torchbucket._checks import check_config, count, number, seconds, size, switch, text
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
    are read, at most 32 per group, a group's total at most the cap), composed
    server-side into ``<composite_prefix><uuid>``, read with one GET, split back
    by their listed sizes, and the composite deleted. Larger objects, and groups
    of one, are read directly. The local filesystem (``file://``) never
    composes: a local read costs no round trip.

    Which dataset composes by default, by measurement
    (``benchmarks/dataloading.py --quick``: emulator model store, same-region
    latency model, ``DataLoader(num_workers=2, batch_size=64)``, medians of 3
    runs on a shared 2-core machine; objects/s, client CPU ms per object,
    requests per 6,000 or 10,000 objects)::

                           6,000 x 10 KiB                  10,000 x 100 KiB
        iterable, compose 10,081/s  0.080 ms  184 A + 312 B  4,263/s  0.272 ms  310 A + 438 B
        iterable, direct   5,886/s  0.183 ms  6,000 B        3,581/s  0.370 ms  10,000 B
        map, compose       1,142/s  0.098 ms  188 A + 188 B    962/s  0.274 ms  313 A + 313 B
        map, direct        3,315/s  0.240 ms  6,000 B        2,909/s  0.398 ms  10,000 B

    - :class:`~torchbucket.datasets.BucketIterableDataset` composes by
      default: its prefetch window keeps enough groups in flight to hide the
      compose round trip (and reads its first 64 objects directly, so the
      first batch does not wait for one), so compose is faster (1.71x at
      10 KiB, 1.19x at 100 KiB) and costs less client CPU (0.44x, 0.74x) and
      fewer requests.
    - :class:`~torchbucket.datasets.BucketMapDataset` batch at a time (any
      sampler but its own) reads directly by
      default: a batch cannot start composing before the DataLoader asks for
      it, so the compose round trip (40 ms here) adds to every batch's
      latency; composing cut its objects/s to 0.34x (10 KiB) and 0.33x
      (100 KiB), for 0.41x and 0.69x the client CPU. Turn it on
      (``compose=ComposeConfig()``) where the loader is not the bottleneck and
      requests or client CPU matter more.
    - With a :class:`~torchbucket.datasets.BucketBatchSampler` the map-style
      dataset reads ahead across batches and composes by default, as the
      iterable dataset does: in two runs, compose gave 1.9-2.0x the
      objects/s of direct reads at 10 KiB (9,359 against 5,006) and 1.3-1.6x
      at 100 KiB (3,616 against 2,300), for 0.45x and 0.7x the client CPU.

    Request cost: GCS bills a compose as a class A operation (12.5x a class
    B GET at Standard-class list prices; deletes are free): the iterable
    dataset's 184 A + 312 B cost about 0.44x the 6,000 B of direct reads.

    Attributes:
        enabled: Coalesce at all. Default ``True`` (the map-style dataset
            batch at a time uses ``ComposeConfig(enabled=False)`` unless given
            one).
        max_composite_object_size: Cap on a composite's size in bytes, at
            least 1. Default 4 MiB (see
            :data:`DEFAULT_MAX_COMPOSITE_OBJECT_SIZE` for the measurement).
        max_sources: Objects per composite, 2 to 32 (the GCS limit). Default 32.
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
        read_around_after: A group whose compose and composite read have
            taken this many times the median of the process's recent ones
            (at least ``read_around_floor``) is also read object by object,
            and whichever finishes first is used; the compose goes on and its
            composite is deleted as usual. A compose is a write, never sent
            twice; this bounds what a straggling compose costs the window
            (with GCS's tail, or the emulator's ``same-region-tail`` preset,
            a stalled compose held every object behind it for seconds).
            The same bound sends a composite's delete again when it has taken
            this many times the median of recent deletes (at least
            ``read_around_floor``): the delete is pinned to the composite's
            generation, so the second finds it gone if the first went
            through, and an epoch, which ends by waiting for its deletes, no
            longer waits out a stalled one. ``0`` turns both off. Default 4.
        read_around_floor: Seconds a group's compose path (or a composite's
            delete) may always take before it is read around (sent again).
            Default 0.25.
        read_around_needed_after: The ``read_around_after`` of a group its
            consumer is already waiting for (the head of a dataset's
            prefetch window, with every result behind it held): read around
            after this many times the recent median (at least
            ``read_around_needed_floor``). Waiting for such a group overlaps
            no other work, so it pays to give up on it sooner; groups still
            ahead of their consumer keep the longer bound, which keeps the
            extra requests few. ``0`` turns it off. Default 2.
        read_around_needed_floor: Seconds a waited-for group's compose path
            may always take before it is read around. Default 0.1.
        anchor: A dataset's prefetch window (one per DataLoader worker and
            epoch) uploads an empty object under ``composite_prefix`` and
            names it as the first source of each of its composes (so groups
            hold ``max_sources - 1`` objects); at the window's end it deletes
            it, which revokes any compose not yet applied. An epoch then no
            longer waits for the answer of a compose left running after its
            group was read around (a compose held before it was applied may
            still make its composite until it answers). Costs one class A
            request (the upload) and one free delete per window and bucket.
            Default ``True``.
    """

    enabled: bool = switch(True)
    max_composite_object_size: int = size(DEFAULT_MAX_COMPOSITE_OBJECT_SIZE)
    max_sources: int = count(COMPOSE_MAX_SOURCES, minimum=2, maximum=COMPOSE_MAX_SOURCES)
    composite_prefix: str = text(COMPOSITE_PREFIX, starts_with=(COMPOSITE_PREFIX,), ends_with="/")
    throttle_cooldown: float = seconds(30.0)
    allow_with_soft_delete: bool = switch(False)
    read_around_after: float = number(4.0, minimum=0)
    read_around_floor: float = seconds(0.25)
    read_around_needed_after: float = number(2.0, minimum=0)
    read_around_needed_floor: float = seconds(0.1)
    anchor: bool = switch(True)

    def __post_init__(self) -> None:
        check_config(self)
