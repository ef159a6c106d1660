"""``BucketShardMapDataset``: packed samples by index, one ranged GET per sample."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from torchbucket import runtime
from torchbucket._checks import check_instance
from torchbucket.datasets.checks import check_configs, check_source_arguments
from torchbucket.datasets.format_fn import call_format_fn
from torchbucket.datasets.workers import settle_worker
from torchbucket.errors import IntegrityError
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.shards._catalog import ShardSet
from torchbucket.shards._stream import describe_sample, member_sample
from torchbucket.shards.config import ShardReadConfig
from torchbucket.storage.crc32c import extend
from torchbucket.storage.ranges import merge_ranges

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketShardMapDataset"]

_HINT = "build the dataset with from_prefix"

# Samples of one shard whose ranges lie at most this far apart are fetched
# with one GET in a batch: reading a few unneeded bytes costs less than a
# request (a 20 ms round trip moves ~4 MB at 200 MB/s).
_MERGE_GAP = 256 * 1024


class BucketShardMapDataset(Dataset[Any]):
    """The samples of packed shards, by index, for any sampler.

    Needs the indexes ``torchbucket pack`` writes: sample ``i`` is fetched
    with one ranged GET of its members' bytes, each checked against its
    CRC32C. With automatic batching the DataLoader calls :meth:`__getitems__`,
    which fetches a batch's samples concurrently, one GET per run of nearby
    samples of a shard, so ``shuffle=True`` costs no per-object requests.
    Samples are numbered in shard order, then in order within a shard.

    Args:
        shards: The shards (use :meth:`from_prefix`); every one indexed.
        data_format_fn: Turns a sample (a dict of one key's members, or one
            member's bytes for ``group_by="none"``) into what the model needs.
        shard_read: Of a ``ShardReadConfig``, only ``freeze_gc`` applies here (the
            rest is about streaming). Default ``ShardReadConfig()``.

    Raises:
        ConfigError: A shard has no index.
    """

    def __init__(
        self,
        shards: ShardSet,
        *,
        data_format_fn: Callable[[Any], Any] | None = None,
        shard_read: ShardReadConfig | None = None,
    ) -> None:
        owner = type(self).__name__
        check_instance(
            shards, ShardSet, owner=owner, parameter="shards", optional=False, hint=_HINT
        )
        check_configs(owner, data_format_fn, shard_read=(shard_read, ShardReadConfig))
        for i in range(len(shards)):
            shards.index(i)  # raises, naming the shard, where there is none
        self._shards = shards
        self._format = data_format_fn
        self._freeze_gc = (shard_read if shard_read is not None else ShardReadConfig()).freeze_gc
        counts = [shards.index(i).num_samples for i in range(len(shards))]
        self._bounds = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._bounds[1:])

    @classmethod
    def from_prefix(
        cls,
        uri: str,
        *,
        data_format_fn: Callable[[Any], Any] | None = None,
        gcs: GCSConfig | None = None,
        listing: ListingConfig | None = None,
        shard_read: ShardReadConfig | None = None,
    ) -> BucketShardMapDataset:
        """The packed shards under a prefix, or of a manifest URI.

        Raises:
            NotFoundError: No manifest and no shards there.
            ConfigError: A shard has no index, or an argument is not of its type.
        """
        owner = f"{cls.__name__}.from_prefix"
        check_source_arguments(owner, gcs, listing, shard_read=(shard_read, ShardReadConfig))
        shards = ShardSet.open(uri, gcs=gcs, listing=listing)
        return cls(shards, data_format_fn=data_format_fn, shard_read=shard_read)

    def __len__(self) -> int:
        return int(self._bounds[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, sample in shard)`` of sample ``index``.

        Raises:
            IndexError: ``index`` is out of range.
        """
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} samples")
        shard = int(np.searchsorted(self._bounds, i, side="right")) - 1
        return shard, i - int(self._bounds[shard])

    def __getitem__(self, index: int) -> Any:
        """The sample at ``index`` (one ranged GET).

        Raises:
            IndexError: ``index`` is out of range.
            IntegrityError: A member's bytes do not match its CRC32C.
        """
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, fetched concurrently.

        Raises:
            IndexError: An index is out of range.
            StorageError: A read failed.
        """
        located = [self.locate(i) for i in indices]
        settle_worker(self._freeze_gc)
        samples = runtime.run(self._fetch(located))
        fn = self._format
        if fn is None:
            return samples
        return [
            call_format_fn(
                fn, sample, describe_sample(sample, f"sample {i} of {self._shards.uri(s)}")
            )
            for i, (s, _), sample in zip(indices, located, samples)
        ]

    async def _fetch(self, located: list[tuple[int, int]]) -> list[Any]:
        shards = self._shards
        spans: dict[int, set[tuple[int, int]]] = {}
        for shard, s in located:
            spans.setdefault(shard, set()).add(shards.index(shard).data_range(s, s + 1))
        # One GET per run of nearby samples of a shard (none for a sample whose
        # members are all empty).
        reads = [
            (shard, start, end)
            for shard, ranges in spans.items()
            for start, end in merge_ranges(ranges, _MERGE_GAP)
        ]

        async def get(shard: int, start: int, end: int) -> bytes:
            info = shards.shards[shard]
            return await shards.store.get(
                info.name, start=start, end=end, generation=info.generation
            )

        bodies = await gather_or_cancel(get(*r) for r in reads)
        out = []
        for shard, s in located:
            index = shards.index(shard)
            lo, hi = index.data_range(s, s + 1)
            # Where no read covers the sample, it is empty: b"" from offset lo.
            base, body = next(
                ((r[1], body) for r, body in zip(reads, bodies) if _covers(r, shard, lo, hi)),
                (lo, b""),
            )
            members = []
            for m in index.members_of(s):
                off, size = int(index.offsets[m]) - base, int(index.sizes[m])
                data = body[off : off + size]
                if len(data) != size or extend(0, data) != int(index.crc32c[m]):
                    data = await self._reread(shard, m)
                members.append((index.name(m), data))
            out.append(member_sample(members, shards.group_by, shards.uri(shard)))
        return out

    async def _reread(self, shard: int, member: int) -> bytes:
        shards = self._shards
        index = shards.index(shard)
        info = shards.shards[shard]
        off, size = int(index.offsets[member]), int(index.sizes[member])
        data = await shards.store.get(
            info.name, start=off, end=off + size, generation=info.generation
        )
        if len(data) != size or extend(0, data) != int(index.crc32c[member]):
            what = (
                f"the shard ends before [{off}, {off + size}) (truncated shard)"
                if len(data) != size
                else f"CRC32C mismatch at [{off}, {off + size}), also when read again"
            )
            raise IntegrityError(
                f"member {index.name(member)!r}: {what}",
                operation="read shard",
                uri=shards.uri(shard),
            )
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} samples in {len(self._shards)} shards)"


def _covers(read: tuple[int, int, int], shard: int, lo: int, hi: int) -> bool:
    """Whether ``read`` (shard, start, end) holds the bytes ``[lo, hi)`` of ``shard``."""
    return read[0] == shard and read[1] <= lo and hi <= read[2]
