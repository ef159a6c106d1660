"""``BucketStorageReader``: ``torch.distributed.checkpoint`` loads from a bucket."""

from __future__ import annotations

import logging
import os
import queue
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from torchbucket import runtime
from torchbucket._checks import check_int
from torchbucket._uri import is_bucket_uri
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint.buffers import MemoryFile, allocate
from torchbucket.dcp._common import (
    check_dcp_arguments,
    join,
    metadata_name,
    normalize,
)
from torchbucket.dcp._loading import (
    Window,
    covers,
    file_crc,
    view_saved_tensor,
    weights_only_bytes,
)
from torchbucket.dcp._loading import pieces as cut_pieces
from torchbucket.dcp._pins import Pin, PinnedStore, file_infos, pins_of, replaced_error
from torchbucket.dcp._unpickle import load_metadata
from torchbucket.errors import CheckpointError, IntegrityError, NotFoundError
from torchbucket.storage import crc32c as _crc32c
from torchbucket.storage.base import ObjectStore
from torchbucket.storage.ranges import fetch_ranges, merge_ranges

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketStorageReader"]

logger = logging.getLogger(__name__)

#: Put on the queue of finished ranges when the download is over.
_FETCH_OVER = -1
_NO_BYTES = memoryview(b"")

#: Gaps up to this size between needed ranges are read through.
DEFAULT_MAX_GAP = 1 << 20

#: Reads of a file whose bytes fail its CRC32C before the load fails.
_LOAD_ATTEMPTS = 3

#: Bytes downloaded ahead of the items loaded into the state dict (a range
#: larger than this still goes, alone). On a 2-core machine the download
#: outruns loading: unbounded, a rank held nearly its whole part of the
#: checkpoint in buffers beside the state dict it loads into (0.87 of it for
#: the benchmark's 512 MiB).
_BYTES_AHEAD = 64 << 20


class BucketStorageReader(StorageReader):
    """Reads a DCP checkpoint from ``gs://``, ``memory://`` or ``file://``.

    Each rank fetches only the byte ranges of the items it loads (adjacent
    ranges merged into one request), in parallel, not whole files. A checkpoint
    whose ``.metadata`` is missing is incomplete (its save did not finish) and
    is refused with :class:`~torchbucket.errors.NotFoundError`.

    Args:
        uri: The checkpoint's "directory".
        checkpoint: A :class:`CheckpointConfig`: range size and reads in
            flight. Default ``CheckpointConfig()``.
        gcs: Endpoint and credentials for ``gs://``. Default ``GCSConfig()``.
        bucket_checkpoint: A :class:`BucketCheckpoint` to use instead of making
            one from ``checkpoint`` and ``gcs`` (giving it with either is a
            :class:`~torchbucket.errors.ConfigError`).
        max_gap: Gaps of at most this many bytes between needed ranges of one
            file are read through rather than split. Default 1 MiB.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        checkpoint: CheckpointConfig | None = None,
        gcs: GCSConfig | None = None,
        bucket_checkpoint: BucketCheckpoint | None = None,
        max_gap: int = DEFAULT_MAX_GAP,
    ) -> None:
        super().__init__()
        check_dcp_arguments(self, uri, checkpoint, gcs, bucket_checkpoint)
        check_int(max_gap, owner=type(self).__name__, parameter="max_gap", minimum=0)
        self.uri = normalize(uri)
        self.checkpoint = bucket_checkpoint or BucketCheckpoint(config=checkpoint, gcs=gcs)
        self.max_gap = max_gap
        self.storage_data: dict[Any, _StorageInfo] = {}
        #: What each data file held when saved, by name (``None``: not recorded).
        self.pins: dict[str, Pin] | None = None
        self._metadata_error: CheckpointError | None = None
        self.load_id = uuid.uuid4().hex
        self.rank: int | None = None
        #: Bytes fetched by the last ``read_data`` (for tests and benchmarks).
        self.bytes_fetched = 0

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.storage_data = {}
        self.pins = None
        self._metadata_error = None
        if checkpoint_id:
            self.uri = normalize(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read ``.metadata`` (or the rank's own ``__{rank}.metadata``), running no code from it.

        Raises:
            NotFoundError: There is none: the checkpoint is incomplete or absent.
            CheckpointError: It is not DCP metadata (corrupt, truncated) or names
                a class DCP metadata is not made of (see :mod:`._unpickle`).
        """
        rank = kwargs.get("rank")
        uri = join(self.uri, metadata_name(rank))
        try:
            with self.checkpoint.reader(uri) as f:
                data = f.read()
        except NotFoundError as exc:
            if rank is not None and self._metadata_error is not None:
                # torch falls back to a rank's own metadata when ``.metadata``
                # fails to load: the reason is that failure, not this absence.
                raise self._metadata_error from exc
            raise NotFoundError(
                f"no {metadata_name(rank)}: the checkpoint does not exist or its "
                "save did not finish (the metadata is written last)",
                operation="dcp load",
                uri=self.uri,
            ) from exc
        try:
            metadata = load_metadata(data, uri)
        except CheckpointError as exc:
            self._metadata_error = exc
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise NotFoundError(
                "the checkpoint's metadata lists no storage", operation="dcp load", uri=self.uri
            )
        self.rank = kwargs.get("rank")
        self.pins = pins_of(metadata, join(self.uri, metadata_name(None)))
        if self.pins is None and is_coordinator:
            logger.info(
                "%s: the checkpoint records no generation or CRC32C of its data files "
                "(written by another writer than BucketStorageWriter): files replaced "
                "since its save cannot be detected",
                self.uri,
            )
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        # One buffer per merged range; every item is a view into one of them.
        jobs: list[tuple[str, memoryview, int]] = []
        job_items: list[list[tuple[ReadItem, int, int]]] = []  # (item, lo, hi) in the buffer
        store, _ = self.checkpoint.open(join(self.uri, metadata_name(None)))
        files: dict[str, str] = {}  # name in the checkpoint, by key
        for name, items in per_file.items():
            _, key = self.checkpoint.open(join(self.uri, name))
            files[key] = name
            spans = [self._span(item) for item in items]
            for start, end in merge_ranges(spans, self.max_gap):
                inside = sorted(
                    (
                        (span, item)
                        for item, span in zip(items, spans, strict=True)
                        if start <= span[0] and span[1] <= end
                    ),
                    key=lambda pair: pair[0],
                )
                # Cut at item boundaries into pieces of about one read chunk,
                # so that items load while the rest still downloads.
                # Each piece reaches the next one's start (the range's end for
                # the last): the padding between items is read too, so that a
                # file read whole can be checked against its CRC32C.
                pieces = cut_pieces(inside, self.checkpoint.config.range_size)
                starts = [piece[0][0][0] for piece in pieces]
                for n, piece in enumerate(pieces):
                    lo = starts[n]
                    hi = starts[n + 1] if n + 1 < len(pieces) else end
                    hi = max(hi, *(span[1] for span, _ in piece))
                    jobs.append((key, allocate(hi - lo), lo))
                    job_items.append([(item, a - lo, b - lo) for (a, b), item in piece])
        self.bytes_fetched = sum(len(buffer) for _, buffer, _ in jobs)
        if jobs:
            self._fetch_verified(store, files, jobs, job_items, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint's URI."""
        return self.uri

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return is_bucket_uri(checkpoint_id)

    # -- internals -----------------------------------------------------------

    def _fetch_verified(
        self,
        store: ObjectStore,
        files: dict[str, str],
        jobs: list[tuple[str, memoryview, int]],
        job_items: list[list[tuple[ReadItem, int, int]]],
        planner: LoadPlanner,
    ) -> None:
        """:meth:`_fetch_and_load`, from the pinned generations, each file read whole checked.

        Each file is read at the generation ``.metadata`` pins it to (or, for a
        checkpoint without pins, the one it has when the load starts): a file
        rewritten or deleted since is a :class:`CheckpointError`.

        A range of a file is not the whole object, so GCS gives no checksum for
        it, and a corrupt answer would load wrong values silently. Where the
        ranges read cover a whole file (a full load does), their CRC32Cs are
        combined and compared with the object's; a mismatch reads and loads
        that file's ranges again (loading overwrites what the bad bytes
        loaded), as checkpoint loads do, and one that persists is an
        ``IntegrityError``. A file read only in part is checked by length only.
        """
        spans = [(key, start, len(buffer)) for key, buffer, start in jobs]
        keys = sorted({key for key, _, _ in spans})
        infos = runtime.run(file_infos(store, files, self.pins))
        pinned = cast(ObjectStore, PinnedStore(store, {k: i.generation for k, i in infos.items()}))
        checked = {k for k in keys if infos[k].crc32c and covers(spans, k, infos[k].size)}
        pending = list(range(len(jobs)))
        for attempt in range(1, _LOAD_ATTEMPTS + 1):
            # The first read fills (and frees, as items load) the caller's buffers.
            todo = (
                jobs
                if attempt == 1
                else [(k, allocate(n), st) for k, st, n in (spans[i] for i in pending)]
            )
            crcs: dict[int, int] = {}

            def note(
                index: int, buffer: memoryview, at: list[int] = pending, crcs: dict[int, int] = crcs
            ) -> None:
                if spans[at[index]][0] in checked:
                    crcs[at[index]] = _crc32c.extend(0, buffer)

            try:
                self._fetch_and_load(pinned, todo, [job_items[i] for i in pending], planner, note)
            except NotFoundError as exc:
                raise replaced_error(exc, self.uri, store, infos) from exc
            bad = {spans[i][0] for i in pending} & checked
            bad = {key for key in bad if file_crc(spans, crcs, key) != infos[key].crc32c}
            if not bad:
                return
            uris = ", ".join(store.uri(key) for key in sorted(bad))
            if attempt == _LOAD_ATTEMPTS:
                raise IntegrityError(
                    f"the bytes read do not match the CRC32C of {uris} on {attempt} reads",
                    operation="checkpoint load",
                    uri=self.uri,
                )
            logger.warning("%s: CRC32C mismatch in %s; reading it again", self.uri, uris)
            pending = [i for i in pending if spans[i][0] in bad]

    def _fetch_and_load(
        self,
        store: ObjectStore,
        jobs: list[tuple[str, memoryview, int]],
        job_items: list[list[tuple[ReadItem, int, int]]],
        planner: LoadPlanner,
        on_arrived: Callable[[int, memoryview], None] | None = None,
    ) -> None:
        """Download the ranges; load each one's items as soon as it has arrived.

        Items are loaded here, in the calling thread, while later ranges still
        download on the background loop. ``on_arrived(index, buffer)`` sees each
        range's bytes before its items load.
        """
        config = self.checkpoint.config
        ready: queue.SimpleQueue[int] = queue.SimpleQueue()
        window = Window([len(buffer) for _, buffer, _ in jobs], _BYTES_AHEAD)

        async def fetch() -> None:
            try:
                window.start()
                await fetch_ranges(
                    store,
                    jobs,
                    chunk_size=config.range_size,
                    parallelism=config.reads_in_flight,
                    on_job_done=ready.put,
                    admit=window.admit,
                )
            finally:
                window.stop()
                ready.put(_FETCH_OVER)

        fetching = runtime.submit(fetch())
        try:
            while (index := ready.get()) != _FETCH_OVER:
                key, buffer, start = jobs[index]
                if on_arrived is not None:
                    on_arrived(index, buffer)
                for item, lo, hi in job_items[index]:
                    self._load_item(item, buffer[lo:hi], planner)
                # Loaded: its buffer is freed now rather than with the others,
                # and as many bytes more may download.
                jobs[index] = (key, _NO_BYTES, start)
                del buffer
                window.done(index)
            fetching.result()  # raises what stopped the download
        finally:
            if not fetching.done():
                # Loading an item failed: stop the download (the buffers stay
                # alive for as long as a request still holds a view of them).
                fetching.cancel()

    def _span(self, item: ReadItem) -> tuple[int, int]:
        info = self.storage_data[item.storage_index]
        return info.offset, info.offset + info.length

    def _load_item(self, item: ReadItem, data: memoryview, planner: LoadPlanner) -> None:
        info = self.storage_data[item.storage_index]
        if info.transform_descriptors:
            raise NotImplementedError(
                f"{self.uri}/{info.relative_path}: stream transforms "
                f"{info.transform_descriptors} are not supported"
            )
        name = f"{self.uri}/{info.relative_path}"
        if item.type == LoadItemType.BYTE_IO:
            fqn = item.storage_index.fqn
            planner.load_bytes(item, weights_only_bytes(name, fqn, data, self.uri))
            return
        tensor = view_saved_tensor(name, data)
        if tensor is None:
            stream = MemoryFile(name, data)
            tensor = torch.load(stream, map_location="cpu", weights_only=True)  # type: ignore[arg-type]
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"{self.uri}: {item.storage_index.fqn} has size {tuple(tensor.size())} in the "
                f"checkpoint but {tuple(target.size())} in the state dict"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)
