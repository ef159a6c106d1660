"""``BucketStorageWriter``: ``torch.distributed.checkpoint`` saves into a bucket."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import uuid
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from torchbucket import runtime
from torchbucket._checks import check_int
from torchbucket._uri import is_bucket_uri
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.dcp._commit import commit_metadata, delete_metadata, files_of
from torchbucket.dcp._common import (
    DATA_SUFFIX,
    check_dcp_arguments,
    join,
    metadata_name,
    normalize,
)
from torchbucket.dcp._pins import Pin, record_pins
from torchbucket.errors import NotFoundError, StorageError

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["BucketStorageWriter"]

#: Items begin at multiples of this many bytes in a data file.
_ALIGNMENT = 64

#: Hex digits of the save's id in its data files' names.
_TOKEN_LENGTH = 12


@dataclasses.dataclass(frozen=True)
class _Written:
    """What a rank reports of one item it wrote: where it is, and its file's pin."""

    info: _StorageInfo
    pin: Pin


def _item_size(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    dtype: torch.dtype = item.tensor_data.properties.dtype
    return int(item.tensor_data.size.numel()) * dtype.itemsize


def split_items(items: list[WriteItem], files: int) -> list[list[WriteItem]]:
    """Spread write items over ``files`` files of about equal size (largest first)."""
    buckets: list[list[WriteItem]] = [[] for _ in range(files)]
    sizes = [0] * files
    blobs = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensors = sorted(
        (i for i in items if i.type != WriteItemType.BYTE_IO), key=_item_size, reverse=True
    )
    for n, item in enumerate(blobs):
        buckets[n % files].append(item)
    for item in tensors:
        smallest = sizes.index(min(sizes))
        buckets[smallest].append(item)
        sizes[smallest] += _item_size(item)
    return [bucket for bucket in buckets if bucket] or [[]]


def _cpu_compact(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().size() != tensor.nbytes:
        # torch.save writes a view's whole storage; save only the view's bytes.
        tensor = tensor.clone()
    return tensor


class BucketStorageWriter(StorageWriter):
    """Writes a DCP checkpoint to ``gs://``, ``memory://`` or ``file://``.

    Every rank uploads its files at once, each file as a parallel multipart
    upload streamed from ``torch.save``; the coordinator writes ``.metadata``
    last, after every rank's files are complete, so a checkpoint without it is
    incomplete and :class:`BucketStorageReader` refuses it. Before any data is
    written the coordinator deletes an old ``.metadata`` at the same place, so
    that a save over an old checkpoint that dies half-way leaves an incomplete
    checkpoint, never old metadata pointing into new files. It deletes the
    generation it read: a ``.metadata`` another save wrote meanwhile is left
    (and this save's commit fails, as below).

    ``.metadata`` records the generation, size and CRC32C of every data file,
    and :class:`BucketStorageReader` reads exactly those, so a file rewritten
    or replaced after the save fails the load instead of loading other values.

    Concurrent saves to one ``uri``: the first to finish wins, whole; a later
    one fails. Each save writes data files of its own (``__{rank}_{n}.{token}.distcp``,
    the token new for every save), so saves never write into each other's
    files, and ``.metadata`` is written only if none exists (the save removed
    the old one before writing data): a save that finds another's there raises
    :class:`~torchbucket.errors.PreconditionFailedError` and deletes its own
    data files. A save that wins deletes the data files of the checkpoint it
    replaced.

    The layout is ``FileSystemWriter``'s but for the data files' names:
    copied to a local folder, the checkpoint loads with ``FileSystemReader``.

    Example::

        dcp.save(state_dict, storage_writer=BucketStorageWriter("gs://bkt/ckpt/step-100"))

    Args:
        uri: The checkpoint's "directory", for example ``gs://bucket/run/step-100``.
        checkpoint: A :class:`CheckpointConfig`: part sizes and parallelism.
            Default ``CheckpointConfig()``.
        gcs: Endpoint and credentials for ``gs://``. Default ``GCSConfig()``.
        bucket_checkpoint: A :class:`BucketCheckpoint` to use instead of making
            one from ``checkpoint`` and ``gcs`` (giving it with either is a
            :class:`~torchbucket.errors.ConfigError`).
        files_per_rank: Data files each rank writes, in parallel. Default 1: the
            parts of one file already upload in parallel.
        overwrite: Allow saving where a complete checkpoint exists. Default True.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        checkpoint: CheckpointConfig | None = None,
        gcs: GCSConfig | None = None,
        bucket_checkpoint: BucketCheckpoint | None = None,
        files_per_rank: int = 1,
        overwrite: bool = True,
    ) -> None:
        super().__init__()
        check_dcp_arguments(self, uri, checkpoint, gcs, bucket_checkpoint)
        check_int(files_per_rank, owner=type(self).__name__, parameter="files_per_rank", minimum=1)
        self.uri = normalize(uri)
        self.checkpoint = bucket_checkpoint or BucketCheckpoint(config=checkpoint, gcs=gcs)
        self.files_per_rank = files_per_rank
        self.overwrite = overwrite
        self.save_id = uuid.uuid4().hex
        #: Data files of the checkpoint this save replaces (deleted when it wins).
        self._replaced: list[str] = []
        self.rank: int | None = None
        self.is_coordinator = False
        self.use_collectives = True

    # -- StorageWriter -------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.uri = normalize(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._replaced = []

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def _own_metadata_rank(self) -> int | None:
        return self.rank if not self.use_collectives else None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if self.is_coordinator or not self.use_collectives:
            name = metadata_name(self._own_metadata_rank())
            store, key = self.checkpoint.open(join(self.uri, name))
            try:
                old = runtime.run(store.head(key))
            except NotFoundError:
                old = None
            if old is not None:
                if not self.overwrite:
                    raise StorageError(
                        "a complete checkpoint exists here and overwrite=False",
                        operation="dcp save",
                        uri=self.uri,
                    )
                # One generation read and deleted: see _commit.
                self._replaced = files_of(self.checkpoint, self.uri, name, old.generation)
                delete_metadata(self.checkpoint, self.uri, name, old.generation)
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_"))
            if plan.storage_data is None
            else plan
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix: _StoragePrefix = plan.storage_data
        token = self.save_id[:_TOKEN_LENGTH]
        files = [
            (f"{prefix.prefix}{n}.{token}{DATA_SUFFIX}", items)
            for n, items in enumerate(split_items(plan.items, self.files_per_rank))
            if items  # a rank with nothing to save writes no file
        ]
        results: list[WriteResult] = []
        if len(files) == 1:
            results = self._write_file(files[0][0], files[0][1], planner)
        elif files:
            with concurrent.futures.ThreadPoolExecutor(
                len(files), thread_name_prefix="torchbucket-dcp"
            ) as pool:
                for chunk in pool.map(lambda f: self._write_file(f[0], f[1], planner), files):
                    results.extend(chunk)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        written: list[_Written] = [r.storage_data for rs in results for r in rs]
        metadata.version = "1.0.0"  # torch's CURRENT_DCP_VERSION for this layout
        metadata.storage_data = {r.index: r.storage_data.info for rs in results for r in rs}
        pins = {w.info.relative_path: w.pin for w in written}
        record_pins(metadata, pins)
        metadata.storage_meta = self.storage_meta()
        commit_metadata(
            self.checkpoint,
            self.uri,
            metadata_name(self._own_metadata_rank()),
            metadata,
            written=set(pins),
            replaced=self._replaced,
        )

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.uri, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint's URI."""
        return self.uri

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return is_bucket_uri(checkpoint_id)

    # -- internals -----------------------------------------------------------

    def _write_file(
        self, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        results: list[WriteResult] = []
        infos: list[_StorageInfo] = []
        with self.checkpoint.writer(join(self.uri, name)) as stream:
            # Blobs first, then tensors, as FileSystemWriter orders them.
            ordered = sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO)
            for item in ordered:
                # Each item starts on a 64-byte boundary (the zip inside aligns
                # the tensor's bytes to 64 from its start), so that readers can
                # view the bytes as the tensor in place, without a copy.
                stream.write(bytes(-stream.tell() % _ALIGNMENT))
                offset = stream.tell()
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    stream.write(data.getbuffer())
                else:
                    assert isinstance(data, torch.Tensor)
                    torch.save(_cpu_compact(data), stream)  # type: ignore[arg-type]
                length = stream.tell() - offset
                infos.append(_StorageInfo(name, offset, length))
        saved = stream.info
        assert saved is not None  # set by a successful close
        pin = Pin(saved.generation, saved.crc32c, saved.size)
        for item, info in zip(ordered, infos, strict=True):
            results.append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=info.length,
                    storage_data=_Written(info, pin),
                )
            )
        return results
