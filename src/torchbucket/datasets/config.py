"""Options of the datasets, grouped in frozen configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torchbucket._checks import check_config, config_error, count, in_flight, one_of, size, switch

__all__ = ["FetchConfig", "ShardingConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchConfig:
    """How objects are fetched.

    The iterable dataset keeps a window of objects ahead of the consumer:
    requested, in flight, or arrived and not yet taken; so does the map-style
    dataset in each process whose batches come from a ``BucketBatchSampler``
    (the batches that process will be asked for next). Keeping many requests in
    flight across batch boundaries is what hides the store's latency; the window
    also bounds memory. The store's adaptive limiter still caps the requests of
    the whole process.

    Attributes:
        reads_in_flight: Requests in flight per iterator (so per DataLoader
            worker); with compose on, ``reads_in_flight // 8`` to
            ``reads_in_flight // 2`` of them
            (at least 2; as many as hold at most 96 MiB) are composed groups of
            up to 32 objects (the first
            ``min(64, reads_in_flight)`` objects of a window, at most a quarter of
            it, are read directly, so the first batch does not wait for a
            compose). Results that arrived and are
            not yet taken do not count here, so a consumer that takes a batch at
            a time does not drain the requests in flight; the window ahead of
            the consumer spans at most four times the objects in flight (when
            composing, four times the objects of the groups in flight, and at
            least twice them), within ``prefetch_size``. Default
            128: at ~20 ms per GET that is ~6,000 objects/s per worker before
            the bandwidth or CPU is the limit.
        prefetch_size: Bytes in the window (in flight, or arrived and not yet
            taken), per iterator; a unit larger than this is still fetched,
            alone. Default ``None``: 128 MiB, whatever the read path.
            Measured with ``benchmarks/sizes.py`` (2 workers, the emulator's
            same-region model, three rounds alternated): at 1 and 4 MiB
            under the latency tail 128 MiB read 1.03-1.19x the samples/s of
            64 MiB, every round, its slowdown against the constant preset
            0.98-1.14 where 64 MiB's was 1.02-1.28 (a worker's window held
            one batch of 64 samples, so each batch waited for its slowest
            GET); under the constant preset 0.89-1.14x, for about 90 MB
            more RSS per worker at 1 MiB and 150 MB at 4 MiB, 5-15% more
            client CPU and a first batch about 0.15 s later; at 16 and 64
            MiB under the tail 1.15-1.18x. Composing at 64 and 256 KiB, 96
            MiB of groups in flight and 128 ahead read 1.02-1.12x the
            samples/s of 48 in flight and 96 ahead under the tail, and
            0.93-1.11x under the constant preset, for 25-40 MB more RSS per
            worker.
        output: What ``data_format_fn`` receives, and a sample is without one.
            ``"bytes"``: a ``bytes`` object (the default, as ``data_format_fn``
            always received). ``"tensor"``: a 1-D ``torch.uint8`` tensor that
            the object was received into; in a DataLoader worker it lies in
            shared memory, so the DataLoader hands it (or any view of it) to
            the main process by handle instead of pickling and copying its
            bytes. Objects read through a composite are views of one tensor
            per composite, and objects read one by one views of shared
            segments of up to 64 of them (a batch crosses with a handle per
            composite or segment; a view keeps its whole one alive).
            Pick ``"tensor"`` for raw samples of about 1 MiB and more
            (audio, video, large images, ``.npy``/``.pt`` blobs, token
            blocks): a ``bytes`` sample is copied into a new ``bytes`` in
            the main process (through shared memory from 32 KiB, see
            ``shared_bytes``; pickled through the worker's pipe below), and
            at 1-64 MiB ``"tensor"`` (with ``reuse_shared_memory``) read
            1.05-1.6x the samples/s at 0.8-1.2 against 1.2-1.5 ms of client
            CPU per MiB (``benchmarks/sizes.py``, two VMs); at 256 KiB 1.07x, and at
            ~10 KiB ``"bytes"`` is faster.
            A ``data_format_fn`` that decodes already hands over only what
            it returns. See the guide's "Which settings matter at which size".
        reuse_shared_memory: With ``output="tensor"``, a DataLoader worker
            reuses a shared-memory segment once the main process holds no
            tensor of it any more, instead of making one per composite or
            segment of objects: its pages are mapped already, and the main
            process opens it through ``/proc/<worker pid>/fd`` with no
            connection to the worker. Segments are memfds (no name in
            ``/dev/shm``; their memory goes with the last process that maps
            them, so an epoch stopped early or a killed worker leaves
            nothing), and a worker keeps up to 64 MiB of free ones. It needs
            Linux, ``/proc``, and a main process that may open its workers'
            descriptors (the same user; a worker checks what it can as it
            starts and makes fresh segments where it cannot). At 100 KiB
            with compose it cut client CPU per object by about a third and
            read 1.34x the samples/s of tensor output without it (see
            docs/benchmarks.md). Default False: torch's own sharing and a
            fresh segment per composite.
        large_object_size: Objects at least this large are read with parallel
            ranged GETs of ``range_size`` bytes into one buffer, instead of
            one stream. Default 8 MiB.
        range_size: Bytes per ranged GET of a large object. Default 8 MiB.
        freeze_gc: In a DataLoader worker, call ``gc.freeze()`` before its
            first read, so that the collector's full passes skip the objects
            inherited from the parent process (170,000 for torch and
            torchbucket alone, then the model's and the dataset's). Without it
            each such pass held a worker's reads for about 0.1 s, a few times
            an epoch, and set the p99 of a map-style batch. Never done in the
            main process. Default True.
        shared_bytes: With ``"bytes"`` output and no ``data_format_fn``, a
            DataLoader worker reads objects of 32 KiB and more (on average)
            into shared-memory segments it reuses and hands each raw sample
            to the main process through them, where it becomes a plain
            ``bytes`` again, instead of pickling it through the worker's
            pipe (in the worker, a ``collate_fn`` sees a ``bytes``
            subclass). It needs what ``reuse_shared_memory`` needs, and
            falls back the same way. The main process then keeps the pages
            those ``bytes`` land in (glibc's malloc thresholds, unless the
            environment tunes malloc). See the guide's "Which settings
            matter at which size". Default True.
    """

    reads_in_flight: int = in_flight(128)
    prefetch_size: int | None = size(None, optional=True)
    output: Literal["bytes", "tensor"] = one_of("bytes", ("bytes", "tensor"))
    reuse_shared_memory: bool = switch(False)
    large_object_size: int = size(8 * 1024 * 1024)
    range_size: int = size(8 * 1024 * 1024)
    freeze_gc: bool = switch(True)
    shared_bytes: bool = switch(True)

    def __post_init__(self) -> None:
        check_config(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardingConfig:
    """How an iterable dataset is split over ranks.

    Ranks take interleaved positions of the epoch's order (rank ``r`` of ``W``
    takes positions ``r, r+W, ...``), then the DataLoader workers of a rank
    split that the same way. Every object is read exactly once per epoch over
    all ranks and workers.

    Attributes:
        rank: This process's rank; ``None`` reads it from ``torch.distributed``
            when initialised, else 0. Default ``None``.
        world_size: Number of ranks; ``None`` reads it from
            ``torch.distributed`` when initialised, else 1. Default ``None``.
        uneven: What to do when the number of objects is not a multiple of the
            world size. ``"keep"``: every object once, so ranks differ by at most
            one object (ranks then run different numbers of steps; with DDP use
            ``"drop"`` or ``"pad"``). ``"drop"``: leave out the last
            ``N % world_size`` objects of each epoch's order (different ones
            each epoch when shuffled). ``"pad"``: repeat the first objects of the
            order to fill up. Default ``"keep"``.
    """

    rank: int | None = count(None, minimum=0, optional=True)
    world_size: int | None = count(None, optional=True)
    uneven: Literal["keep", "drop", "pad"] = one_of("keep", ("keep", "drop", "pad"))

    def __post_init__(self) -> None:
        check_config(self)
        if (self.rank is None) != (self.world_size is None):
            raise config_error(self, "rank", self.rank, "given with world_size (both or neither)")
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise config_error(
                self, "rank", self.rank, f"in 0..world_size - 1 (0..{self.world_size - 1})"
            )
