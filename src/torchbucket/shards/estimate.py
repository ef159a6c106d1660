"""What packing and reading shards ask of the store, counted by the shards' own plans.

For ``torchbucket cost`` (:mod:`torchbucket.cost`): the shards a pack would
write are planned by the pack's planner (``plan_shards``), an epoch's pieces
per rank and worker by the reader's (``worker_pieces``), and their ranged
reads are cut as the reader cuts them (``cut_reads``), so the counts follow
any change to those rules. Object names are made up (``000000000042.bin``):
names longer than a tar header holds would add a header block each.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torchbucket.runtime.accounting import RequestStats
from torchbucket.shards._plan import PlannedShard, plan_shards
from torchbucket.shards._split import worker_pieces
from torchbucket.shards._stream import cut_reads
from torchbucket.shards._tar import BLOCK, member_header, padding
from torchbucket.shards.config import PackConfig, ShardReadConfig
from torchbucket.storage.base import ObjectInfo

__all__ = ["epoch_requests", "open_requests", "pack_requests", "planned_shards"]

_BLOCK = bytes(BLOCK)
_USTAR_MOST = 8 << 30  # a ustar header's size field holds less than 8 GiB


def _ops(**ops: int) -> RequestStats:
    return RequestStats(by_op={k: v for k, v in ops.items() if v})


def _one_block(name: str, size: int) -> bytes:
    # The header of a made-up name: one block (no pax header) below 8 GiB.
    return _BLOCK if size < _USTAR_MOST else member_header(name, size)


def planned_shards(sizes: Sequence[int], pack: PackConfig) -> list[PlannedShard]:
    """The shards ``torchbucket pack`` would write of objects of these sizes, in order."""
    objects = [ObjectInfo(name=f"{i:012d}.bin", size=int(s)) for i, s in enumerate(sizes)]
    # Made-up names have a key each: "key" groups them as "none" does, slower.
    return plan_shards(objects, "", shard_size=pack.shard_size, group_by="none", header=_one_block)


def _parts(shard: PlannedShard, part_size: int) -> int:
    # As ``_pack_write.write_shard`` sends them: a part once a member takes the
    # buffer to part_size or more, then the rest with the end-of-archive blocks.
    parts = 1
    buffered = 0
    for m in shard.members:
        buffered += len(m.header) + m.source.size + padding(m.source.size)
        if buffered >= part_size:
            parts += 1
            buffered = 0
    return parts


def pack_requests(shards: Sequence[PlannedShard], pack: PackConfig) -> RequestStats:
    """A pack's requests, its source's listing left out (count that as the job's).

    The destination's listing and the multipart uploads a crash left (one
    request each); per shard, a GET per member, a multipart upload (initiate,
    parts, complete) and its index; then the manifest.
    """
    members = sum(len(s.members) for s in shards)
    parts = sum(_parts(s, pack.part_size) for s in shards)
    return _ops(
        list=1,
        mpu_list=1,
        get=members,
        mpu_initiate=len(shards),
        mpu_part=parts,
        mpu_complete=len(shards),
        put=len(shards) + 1,
    )


def open_requests(shards: Sequence[PlannedShard]) -> RequestStats:
    """Opening a packed set (once per process): its listing, the manifest, each index."""
    return _ops(list=1, get=1 + len(shards))


def _sample_ranges(shard: PlannedShard) -> tuple[list[int], list[int]]:
    """Per sample, where its first member's data starts and its last one's ends."""
    starts = list(shard.sample_starts)
    ends = [*starts[1:], len(shard.members)]
    members = shard.members
    lo = [members[a].data_offset for a in starts]
    hi = [members[b - 1].data_offset + members[b - 1].source.size for b in ends]
    return lo, hi


def epoch_requests(
    shards: Sequence[PlannedShard], *, ranks: int, workers: int, shard_read: ShardReadConfig
) -> RequestStats:
    """The ranged GETs of one epoch of ``BucketShardDataset`` over indexed shards.

    Every rank's every worker (``workers`` 0 counts as 1) reads its pieces of
    the shards in listing order (a shuffled order moves where the pieces fall,
    not how many reads they take, but for a read or two per worker).
    """
    counts = [len(s.sample_starts) for s in shards]
    bounds = [_sample_ranges(s) for s in shards]
    order = np.arange(len(shards), dtype=np.int64)
    num_workers = max(workers, 1)
    gets = read_bytes = 0
    for rank in range(ranks):
        for worker in range(num_workers):
            pieces = worker_pieces(
                order, counts, rank=rank, world_size=ranks, worker=worker, num_workers=num_workers
            )
            ranges = [
                (p, bounds[shard][0][first], bounds[shard][1][stop - 1])
                for p, (shard, first, stop) in enumerate(pieces)
                if first < stop
            ]
            for _, start, end in cut_reads(ranges, shard_read):
                gets += 1
                read_bytes += end - start
    return RequestStats(by_op={"get": gets} if gets else {}, bytes_in=read_bytes)
