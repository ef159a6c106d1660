"""Another writer of the bucket acts between a step's check and its use; over HTTP and gRPC.

A bucket is shared: whatever this process checked may be replaced, deleted or
forged by another writer before it acts on it. Each test puts that other
writer's step exactly in the gap (a hook on the call that comes next, no
timing), then checks that nothing of the other writer's is read as ours or
deleted, and that nothing of ours is replaced by the other's bytes.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.config import RetryConfig
from torchbucket.dcp import BucketStorageReader, BucketStorageWriter, _commit
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError, PreconditionFailedError
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.listing._manifest import ManifestLocation
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.gcs._pointers import POINTER_PREFIX, pointer_metadata

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

PART = 64 * 1024
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


@pytest.fixture
def store(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="hostile")


# -- a staged checkpoint replaced between its check and its copy ---------------


def test_a_staged_upload_replaced_before_its_copy_leaves_the_checkpoint(
    emulator: Emulator, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = BucketCheckpoint(
        config=CheckpointConfig(part_size=PART, min_part_size=1), gcs=store.config
    )
    uri = f"gs://{store.bucket}/run/model.pt"
    first, second = os.urandom(3 * PART), os.urandom(3 * PART)
    with checkpoint.writer(uri) as f:
        f.write(first)
    real_copy = GCSStore.copy
    replaced: list[str] = []

    async def replaced_first(self: GCSStore, source: str, *args: Any, **kwargs: Any) -> Any:
        # The staged object was checked; another writer replaces it now.
        emulator.seed(store.bucket, {source: os.urandom(len(second))})
        replaced.append(source)
        return await real_copy(self, source, *args, **kwargs)

    monkeypatch.setattr(GCSStore, "copy", replaced_first)
    with pytest.raises(IntegrityError, match=re.escape(uri)), checkpoint.writer(uri) as f:
        f.write(second)
    assert replaced and ".tbtmp-" in replaced[0]
    assert runtime.run(store.get("run/model.pt")) == first
    # The other writer's object is its own to delete: it is left.
    assert emulator.object_names(store.bucket) == sorted(["run/model.pt", replaced[0]])


# -- a DCP save over a checkpoint another save replaced meanwhile ---------------


def _tensors(value: float) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.full((64,), value) for i in range(4)}


def test_a_dcp_save_keeps_the_metadata_another_save_committed_after_it_was_read(
    emulator: Emulator, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"gs://{store.bucket}/ckpt"
    config = CheckpointConfig(part_size=32 * 1024, min_part_size=1)

    def writer() -> BucketStorageWriter:
        return BucketStorageWriter(uri, checkpoint=config, gcs=store.config)

    dcp.save(_tensors(0.0), storage_writer=writer())
    real_load = _commit.load_metadata
    armed = [True]

    def other_save_meanwhile(data: bytes, where: str) -> Any:
        # Save A has read the old .metadata; save B replaces the checkpoint whole.
        if armed.pop() if armed else False:
            dcp.save(_tensors(2.0), storage_writer=writer())
        return real_load(data, where)

    monkeypatch.setattr(_commit, "load_metadata", other_save_meanwhile)
    with pytest.raises(CheckpointException) as caught:
        dcp.save(_tensors(1.0), storage_writer=writer())
    error, _ = next(iter(caught.value.failures.values()))
    assert isinstance(error, PreconditionFailedError) and uri in str(error)
    target = _tensors(-1.0)
    dcp.load(target, storage_reader=BucketStorageReader(uri, checkpoint=config, gcs=store.config))
    assert all(torch.equal(t, torch.full((64,), 2.0)) for t in target.values())
    # B's metadata and its one data file; A removed its own, nothing is orphaned.
    left = emulator.object_names(store.bucket, "ckpt/")
    assert len(left) == 2 and left[0] == "ckpt/.metadata"


# -- a listing cache another writer forged --------------------------------------


def test_a_listing_cache_naming_objects_outside_the_prefix_is_not_used(
    emulator: Emulator, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    emulator.seed(store.bucket, {"c/a": b"a", "c/b": b"b", "secret/key": b"k"})
    cache = f"gs://{store.bucket}/c/_listing.json.gz"
    config = ListingConfig(progress=False, cache=cache)
    uri = store.uri("c/")
    forged = [ObjectInfo("c/a", 1, 1), ObjectInfo("secret/key", 1, 1)]
    runtime.run(ManifestLocation(cache, store).write(uri, config._filters(), forged))
    listed = runtime.run(alist_objects(store, "c/", config=config))
    assert [o.name for o in listed] == ["c/a", "c/b"]
    assert any("secret/key" in r.getMessage() and cache in r.getMessage() for r in caplog.records)


# -- a zonal pointer forged to name another key's data object -------------------


@pytest.fixture
def zonal(grpc_emulator: Emulator) -> Iterator[tuple[Emulator, GCSConfig, str]]:
    bucket = f"zhostile-{uuid.uuid4().hex[:12]}"
    grpc_emulator.create_bucket(bucket, zonal=True)
    gcs = GCSConfig(
        endpoint=grpc_emulator.endpoint,
        grpc_endpoint=f"http://{grpc_emulator.grpc_endpoint}",
        anonymous=True,
        retry=RETRY,
    )
    yield grpc_emulator, gcs, bucket


def _stream(data: bytes) -> Callable[[], AsyncIterator[bytes]]:
    async def chunks() -> AsyncIterator[bytes]:
        yield data

    return chunks


def test_a_pointer_naming_another_keys_data_object_is_not_followed(
    zonal: tuple[Emulator, GCSConfig, str],
) -> None:
    emu, gcs, bucket = zonal
    stores = [GCSStore(bucket, config=gcs) for _ in range(3)]
    owner, hostile, victim = stores
    precious = os.urandom(3 << 20)
    try:
        runtime.run(owner.put_stream("p/model.pt", _stream(precious)()))
        (data_object,) = emu.object_names(bucket, POINTER_PREFIX)
        info = runtime.run(owner.head("p/model.pt"))
        assert info.generation is not None
        forged = pointer_metadata(data_object, info.generation, info.size, info.crc32c)
        path = runtime.run(hostile._router.grpc())
        assert path is not None

        def forge() -> None:
            runtime.run(path._one_message("k/model.pt", b"", content_type=None, metadata=forged))

        forge()
        # A read of k is not sent to p's data.
        assert runtime.run(victim.get("k/model.pt")) == b""
        # Replacing k, and deleting it, leave p's data object alone.
        runtime.run(victim.put_stream("k/model.pt", _stream(b"k" * 1000)()))
        forge()
        runtime.run(victim.delete("k/model.pt"))
        assert data_object in emu.object_names(bucket, POINTER_PREFIX)
        assert runtime.run(GCSStore(bucket, config=gcs).get("p/model.pt")) == precious
    finally:
        for s in stores:
            runtime.run(s.close())
