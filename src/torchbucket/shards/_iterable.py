"""``BucketShardDataset``: tar shards streamed, split, shuffled and resumable."""

from __future__ import annotations

import hashlib
import os
import random
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torchbucket._checks import check_bool, check_instance
from torchbucket.datasets.checks import check_configs, check_source_arguments
from torchbucket.datasets.config import ShardingConfig
from torchbucket.datasets.format_fn import call_format_fn
from torchbucket.datasets.resumable import Layout, ResumableEpochs, check_resume_layout
from torchbucket.datasets.workers import settle_worker
from torchbucket.errors import ConfigError
from torchbucket.shards._catalog import ShardSet
from torchbucket.shards._split import Piece, epoch_order, worker_pieces
from torchbucket.shards._stream import END_OF_PIECE, describe_sample, stream_samples
from torchbucket.shards.config import ShardReadConfig

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketShardDataset"]

_STATE_VERSION = 1
Position = tuple[int, int]  # piece, sample in piece
SampleFormatFn = Callable[[Any], Any]


class BucketShardDataset(ResumableEpochs["_ShardIterator"]):
    """The samples of tar shards (WebDataset layout) as a stream.

    Build it with :meth:`from_prefix` over the output of ``torchbucket pack``
    (it reads the manifest and the shards' indexes) or over any prefix of
    ``.tar`` shards, such as those of ``webdataset.ShardWriter`` (read by
    streaming their headers). A sample is a dict of one key's members
    (``{"__key__": ..., "__url__": shard URI, "jpg": bytes, "cls": bytes}``)
    or, for shards packed with ``group_by="none"``, one member's bytes.

    Each iterator keeps large ranged reads going across shard boundaries
    (``ShardReadConfig``: up to 32 MiB each, 64 MiB in flight, starting with
    one 1 MiB read so the first samples come quickly). Every sample is read
    exactly once per epoch over all ranks and DataLoader workers: with
    indexes, the epoch's samples are cut into contiguous spans per rank and
    worker (counts follow :class:`ShardingConfig`, ``uneven`` included);
    without, whole shards are dealt out (``uneven`` then counts shards).
    With ``shuffle``, the shards' order is a permutation seeded by
    ``(seed, epoch)``, and samples pass a seeded shuffle buffer of
    ``ShardReadConfig.shuffle_buffer`` samples; call :meth:`set_epoch` before
    each epoch.

    :meth:`state_dict` / :meth:`load_state_dict` resume mid-shard, the shuffle
    buffer included, without replaying or skipping a sample (directly or
    through ``torchdata``'s ``StatefulDataLoader``); a resumed iterator reads
    again what it needs of the last shards (at most the buffer's span). A
    mid-epoch state resumes only with the same ranks and workers.

    Each member is checked against the CRC32C its index records (re-read
    once on a mismatch); a shard that is truncated or corrupt raises
    ``IntegrityError`` naming the shard and the member, never ends short.

    Args:
        shards: The shards (use the classmethods instead).
        data_format_fn: Turns a sample into what the model needs; default the
            sample unchanged. Runs in the consuming thread.
        shuffle: Shuffle shards and samples (seeded). Default ``False``.
        seed: Seed of the order; the same on every rank. Default 0.
        sharding: Ranks and uneven counts; default ``ShardingConfig()``.
        shard_read: Reads in flight, read sizes, shuffle buffer; default
            ``ShardReadConfig()``.
    """

    _identity_keys = ("shards", "shuffle", "seed", "uneven", "shuffle_buffer")

    def __init__(
        self,
        shards: ShardSet,
        *,
        data_format_fn: SampleFormatFn | None = None,
        shuffle: bool = False,
        seed: int = 0,
        sharding: ShardingConfig | None = None,
        shard_read: ShardReadConfig | None = None,
    ) -> None:
        owner = type(self).__name__
        hint = "build the dataset with from_prefix"
        check_instance(shards, ShardSet, owner=owner, parameter="shards", optional=False, hint=hint)
        check_configs(
            owner,
            data_format_fn,
            sharding=(sharding, ShardingConfig),
            shard_read=(shard_read, ShardReadConfig),
        )
        check_bool(shuffle, owner=owner, parameter="shuffle")
        self._shards = shards
        self._format = data_format_fn
        self._shuffle = bool(shuffle)
        self._seed = int(seed)
        self._sharding = sharding if sharding is not None else ShardingConfig()
        self._read = shard_read if shard_read is not None else ShardReadConfig()
        self._counts = (
            [i.num_samples for i in shards.indexes if i is not None] if shards.indexed else None
        )
        digest = hashlib.sha256()
        for info in shards.shards:
            digest.update(f"{info.name}\0{info.size}\n".encode())
        self._fingerprint = digest.hexdigest()[:16]
        super().__init__()

    @classmethod
    def from_prefix(
        cls,
        uri: str | os.PathLike[str],
        *,
        data_format_fn: SampleFormatFn | None = None,
        gcs: GCSConfig | None = None,
        listing: ListingConfig | None = None,
        shuffle: bool = False,
        seed: int = 0,
        sharding: ShardingConfig | None = None,
        shard_read: ShardReadConfig | None = None,
    ) -> BucketShardDataset:
        """The shards under a prefix, or of a manifest (a URI ending in ``.json``).

        Args:
            uri: ``gs://bucket/packed/`` or ``gs://bucket/packed/manifest.json``
                (also ``memory://`` and ``file://``).
            data_format_fn: See the class.
            gcs: How to reach GCS, for ``gs://`` URIs.
            listing: A ``ListingConfig`` for listing the prefix.
            shuffle: See the class.
            seed: See the class.
            sharding: See the class.
            shard_read: See the class.

        Raises:
            NotFoundError: No manifest and no ``.tar`` under the prefix.
            ConfigError: An argument is not of its type (before anything is listed).
        """
        owner = f"{cls.__name__}.from_prefix"
        check_source_arguments(
            owner,
            gcs,
            listing,
            sharding=(sharding, ShardingConfig),
            shard_read=(shard_read, ShardReadConfig),
        )
        check_bool(shuffle, owner=owner, parameter="shuffle")
        shards = ShardSet.open(uri, gcs=gcs, listing=listing)
        return cls(
            shards,
            data_format_fn=data_format_fn,
            shuffle=shuffle,
            seed=seed,
            sharding=sharding,
            shard_read=shard_read,
        )

    @property
    def num_shards(self) -> int:
        """Shards in the dataset."""
        return len(self._shards)

    @property
    def num_samples(self) -> int | None:
        """Samples over all shards, or ``None`` when a shard has no index."""
        return None if self._counts is None else sum(self._counts)

    def pieces(self, epoch: int, layout: Layout) -> list[Piece]:
        """The ``(shard, first sample, stop sample)`` pieces one worker reads in ``epoch``."""
        rank, world, worker, workers = layout
        order = epoch_order(len(self._shards), shuffle=self._shuffle, seed=self._seed, epoch=epoch)
        return worker_pieces(
            order,
            self._counts,
            rank=rank,
            world_size=world,
            worker=worker,
            num_workers=workers,
            uneven=self._sharding.uneven,
        )

    def _new_iterator(self, epoch: int, layout: Layout) -> _ShardIterator:
        return _ShardIterator(self, epoch, layout)

    def _fresh_state(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "position": 0,
            "next": [0, 0],
            "buffer": [],
            "rng": None,
            "layout": None,
            "shards": self._fingerprint,
            "shuffle": self._shuffle,
            "seed": self._seed,
            "uneven": self._sharding.uneven,
            "shuffle_buffer": self._read.shuffle_buffer if self._shuffle else 0,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the current (or last) iterator of this process stands.

        Returns:
            Plain values: epoch, samples yielded, the next sample to read, the
            positions held in the shuffle buffer and its random state, the
            layout, and what identifies the shards and the order.
        """
        return self._current_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iterator resume where ``state`` was taken.

        Raises:
            ConfigError: The state is from other shards, order or layout.
        """
        self._resume_next(state)

    def _checked_fields(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "next": [int(x) for x in state["next"]],
            "buffer": [[int(p), int(s)] for p, s in state["buffer"]],
            "rng": state.get("rng"),
        }


class _ShardIterator(Iterator[Any]):
    """One pass over one worker's pieces; the ``dataset_iter`` a DataLoader snapshots."""

    def __init__(self, dataset: BucketShardDataset, epoch: int, layout: Layout) -> None:
        self._dataset = dataset
        self.epoch = epoch
        self._layout = layout
        self._pieces: list[Piece] | None = None
        self._next: Position = (0, 0)
        self._position = 0
        self._buffer: list[tuple[int, int, Any]] = []
        self._rng = self._new_rng() if dataset._shuffle else None
        self._restore: list[Position] | None = None
        self._peeked: tuple[int, int, Any] | None = None
        self._stream: Generator[tuple[int, int, Any], None, None] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _new_rng(self) -> random.Random:
        # A string seed goes through SHA-512: the same in every process.
        return random.Random(f"{self._dataset._seed}:{self.epoch}:{self._layout}")

    def __iter__(self) -> _ShardIterator:
        return self

    def _open(self) -> Generator[tuple[int, int, Any], None, None]:
        ds = self._dataset
        settle_worker(ds._read.freeze_gc)
        if self._pieces is None:
            self._pieces = ds.pieces(self.epoch, self._layout)
        start = min([self._next, *(self._restore or [])])
        stream = stream_samples(ds._shards, self._pieces, ds._read, start=start)
        self._stream = stream
        self._finalizer = weakref.finalize(self, stream.close)
        if self._restore:
            self._fill_restored()
        return stream

    def _pull(self) -> tuple[int, int, Any] | None:
        """The next sample at or after ``_next``; what lies before it is restored or dropped."""
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
            return item
        stream = self._stream if self._stream is not None else self._open()
        for p, s, sample in stream:
            if s == END_OF_PIECE:
                if (p + 1, 0) > self._next:
                    self._next = (p + 1, 0)
                continue
            if (p, s) >= self._next:
                return p, s, sample
            if self._restoring is not None and (p, s) in self._restoring:
                self._restoring[(p, s)] = sample
        return None

    _restoring: dict[Position, Any] | None = None

    def _fill_restored(self) -> None:
        wanted = self._restore or []
        self._restoring = dict.fromkeys(wanted)
        self._restore = None
        self._peeked = self._pull()
        found = self._restoring
        self._restoring = None
        missing = [pos for pos in wanted if found.get(pos) is None]
        if missing:
            raise ConfigError(
                f"cannot restore the shuffle buffer: samples at (piece, sample) {missing[:3]} "
                "were not found; the shards changed since the state was taken"
            )
        self._buffer = [(p, s, found[(p, s)]) for p, s in wanted]

    def __next__(self) -> Any:
        ds = self._dataset
        if self._stream is None:
            self._open()
        if self._rng is None:
            item = self._pull()
            if item is None:
                self.close()
                raise StopIteration
        else:
            buffer = self._buffer
            while len(buffer) < ds._read.shuffle_buffer:
                pulled = self._pull()
                if pulled is None:
                    break
                buffer.append(pulled)
                self._next = (pulled[0], pulled[1] + 1)
            if not buffer:
                self.close()
                raise StopIteration
            j = self._rng.randrange(len(buffer))
            item = buffer[j]
            buffer[j] = buffer[-1]
            buffer.pop()
        p, s, sample = item
        if self._rng is None:
            self._next = (p, s + 1)
        self._position += 1
        if ds._format is None:
            return sample
        return call_format_fn(ds._format, sample, describe_sample(sample))

    def close(self) -> None:
        """Stop reading (called at the end, or when the iterator is dropped)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._stream = None
        self._peeked = None

    def state_dict(self) -> dict[str, Any]:
        """Epoch, samples yielded, next read, shuffle buffer and random state."""
        nxt = self._next
        if self._peeked is not None:
            nxt = (self._peeked[0], self._peeked[1])
        buffer = (
            [list(pos) for pos in self._restore]
            if self._restore is not None
            else [[p, s] for p, s, _ in self._buffer]
        )
        return {
            **self._dataset._fresh_state(),
            "epoch": self.epoch,
            "position": self._position,
            "next": list(nxt),
            "buffer": buffer,
            "rng": None if self._rng is None else _rng_state(self._rng),
            "layout": list(self._layout),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``.

        Raises:
            ConfigError: The state is from other shards, order or layout.
        """
        checked = self._dataset._check_state(state)
        check_resume_layout(checked, self._layout)
        self.close()
        if checked["epoch"] != self.epoch:
            self.epoch = checked["epoch"]
            self._pieces = None
        self._position = checked["position"]
        self._next = (checked["next"][0], checked["next"][1])
        self._buffer = []
        self._restore = [(p, s) for p, s in checked["buffer"]] or None
        if self._dataset._shuffle:
            self._rng = self._new_rng()
            if checked["rng"] is not None:
                self._rng.setstate(_rng_unstate(checked["rng"]))


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_unstate(state: Any) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)
