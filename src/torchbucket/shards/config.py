"""Options of packing and of reading shards, in frozen configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torchbucket._checks import check_config, config_error, count, in_flight, one_of, size, switch

__all__ = ["PackConfig", "ShardReadConfig"]

_MIB = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class PackConfig:
    """How objects are packed into tar shards.

    Attributes:
        shard_size: Target bytes per shard: a shard is closed before the
            sample that would take it past this (a sample larger than it gets
            a shard of its own). Default 256 MiB.
        group_by: ``"key"``: objects ``<key>.<ext>`` with the same key form
            one sample (WebDataset's rule: the key ends at the first dot of
            the last path segment); ``"none"``: each object is a sample.
            Default ``"key"``.
        part_size: Bytes per multipart upload part (GCS's XML API wants at
            least 5 MiB but for the last part). Default 16 MiB.
        reads_in_flight: Source objects being read at once, per shard being
            written. Default 64.
        shards_in_flight: Shards written at once. Default 4; memory is about
            ``shards_in_flight x (2 x part_size + reads_in_flight objects)``.
    """

    shard_size: int = size(256 * _MIB, minimum=4096)
    group_by: Literal["key", "none"] = one_of("key", ("key", "none"))
    # GCS's smallest part (all but the last).
    part_size: int = size(16 * _MIB, minimum=5 * _MIB)
    reads_in_flight: int = in_flight(64)
    shards_in_flight: int = in_flight(4)

    def __post_init__(self) -> None:
        check_config(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardReadConfig:
    """How shards are streamed.

    Attributes:
        reads_in_flight: Ranged GETs in flight per iterator (so per DataLoader
            worker), across shard boundaries, at most. Default 8.
        prefetch_size: Bytes asked for by the reads in flight and not yet
            taken by the consumer, at most (one read always goes). Default
            64 MiB: two reads of ``range_size``; at 200 MB/s per body and
            20 ms to the first byte each takes about 0.2 s, longer than a
            worker needs to cut the samples out of the one before. Memory per
            iterator is about this plus the read being consumed.
        range_size: Bytes per ranged GET once a stream is under way. Default
            32 MiB: a 100 KiB sample then costs about 1/320 of a request.
        first_range_size: Bytes of the first GET of an iterator; later reads
            double up to ``range_size``, and the reads in flight start at one
            and grow by one per read taken, so the first batch waits for one
            small read, not for large ones sharing the bandwidth. Default
            1 MiB.
        shuffle_buffer: Samples held to shuffle within, when shuffling.
            Default 1000 (memory: that many samples).
        freeze_gc: In a DataLoader worker, call ``gc.freeze()`` before its
            first read, as ``FetchConfig.freeze_gc`` does for the other
            datasets (the README's "Troubleshooting"). The only field that
            ``BucketShardMapDataset`` reads. Default True.
    """

    reads_in_flight: int = in_flight(8)
    prefetch_size: int = size(64 * _MIB)
    range_size: int = size(32 * _MIB)
    first_range_size: int = size(1 * _MIB)
    shuffle_buffer: int = count(1000)
    freeze_gc: bool = switch(True)

    def __post_init__(self) -> None:
        check_config(self)
        if self.first_range_size > self.range_size:
            raise config_error(
                self,
                "first_range_size",
                self.first_range_size,
                f"<= range_size ({self.range_size})",
            )
