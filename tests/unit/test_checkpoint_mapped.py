"""``BucketCheckpoint.load`` through file pages that torch maps (issue 45), on the memory store.

The default load (``weights_only=True``) downloads into anonymous pages that
torch's zip loader takes as its overall storage (``_aliased``); others
(``weights_only=False``) download into a memfd (an unlinked temporary file off
Linux) and hand it to ``torch.load(..., mmap=True)`` (``_mapped``). These
tests hold both to what a load guaranteed before: the CRC32C of every byte,
ranges pinned to one generation, no descriptor or file left behind; and check
that the tensors really are the downloaded bytes, that what torch cannot map
or ``weights_only`` refuses falls back (one DEBUG line; torch's own message),
and that ``save`` leaves out torch's unchecked zip CRC32.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import pickle
import sys
import zipfile
from typing import Any

import numpy as np
import pytest
import torch
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint import _aliased as aliased
from torchbucket.checkpoint import _mapped as mapped
from torchbucket.checkpoint._pages import allocate as reader_allocate
from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.storage import MemoryStore

PART = 64 * 1024
CONFIG = CheckpointConfig(part_size=PART, min_part_size=1, range_size=PART, reads_in_flight=1)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd: Linux")


@pytest.fixture
def bucket() -> Any:
    with memory_bucket("mapped") as name:
        yield name


class WrappedStore:
    """A MemoryStore whose ranged reads can be tampered with."""

    def __init__(self, bucket: str) -> None:
        self.inner = MemoryStore(bucket)
        self.bucket = bucket
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def uri(self, key: str = "") -> str:
        return self.inner.uri(key)

    async def get_into(self, key: str, buffer: memoryview, **kwargs: Any) -> int:
        self.reads += 1
        got: int = await self.inner.get_into(key, buffer, **kwargs)
        await self.tamper(key, buffer)
        return got

    async def tamper(self, key: str, buffer: memoryview) -> None:
        pass


class FlippingStore(WrappedStore):
    """Every read's first byte flipped: the bytes in the bucket are not the object's."""

    async def tamper(self, key: str, buffer: memoryview) -> None:
        buffer[0] ^= 0xFF


class RewritingStore(WrappedStore):
    """The object rewritten by another writer after the first range was read."""

    async def tamper(self, key: str, buffer: memoryview) -> None:
        if self.reads == 1:
            await self.inner.put(key, b"z" * 10)


class Custom:
    """A class ``weights_only`` refuses (module-level: pickle finds it)."""

    def __init__(self, value: int) -> None:
        self.value = value


def on(store: WrappedStore) -> BucketCheckpoint:
    checkpoint = BucketCheckpoint(config=CONFIG)
    checkpoint._stores[("memory", store.bucket)] = store
    return checkpoint


def state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(512, 256, generator=g), "b": torch.arange(9), "step": 4}


def saved(bucket: str, name: str = "c.pt") -> str:
    uri = f"memory://{bucket}/{name}"
    BucketCheckpoint(config=CONFIG).save(state(), uri)
    return uri


def open_fds() -> int:
    """Descriptors of download files open in this process (other descriptors come and go)."""
    gc.collect()  # a download another test failed may wait for it
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += "torchbucket-checkpoint" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # closed meanwhile
    return count


def memfd_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("torchbucket-checkpoint" in line for line in f)


@linux_only
def test_a_load_with_corrupt_bytes_fails_with_an_integrity_error_naming_it(bucket: str) -> None:
    uri = saved(bucket)
    store = FlippingStore(bucket)
    before = open_fds()
    with pytest.raises(IntegrityError, match="crc32c") as info:
        on(store).load(uri, weights_only=True)
    assert uri in str(info.value)
    assert store.reads > 1  # read whole twice before it is called corrupt
    del info  # its traceback's frames hold views of the download
    gc.collect()
    assert open_fds() == before and memfd_mappings() == 0


@linux_only
def test_a_checkpoint_rewritten_during_a_load_fails_instead_of_mixing(bucket: str) -> None:
    uri = saved(bucket)
    before = open_fds()
    with pytest.raises(NotFoundError, match="rewritten") as info:
        on(RewritingStore(bucket)).load(uri, weights_only=True)
    assert uri in str(info.value)
    del info
    gc.collect()
    assert open_fds() == before and memfd_mappings() == 0


def test_loaded_tensors_are_views_of_the_downloaded_bytes(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # weights_only=True (the default): the download's own anonymous pages are
    # torch's overall storage, no file and no copy.
    uri = saved(bucket)
    buffers: list[memoryview] = []

    def allocate(size: int) -> memoryview:
        buffers.append(reader_allocate(size))
        return buffers[-1]

    monkeypatch.setattr(aliased, "allocate", allocate)
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=True)
    assert torch.equal(loaded["w"], state()["w"]) and loaded["step"] == 4
    (buffer,) = buffers
    low = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    for name in ("w", "b"):
        tensor = loaded[name]
        start = tensor.data_ptr()
        assert low <= start and start + tensor.nbytes <= low + len(buffer), name
    assert memfd_mappings() == 0
    loaded["w"][0, 0] = 7.0  # writable in place: nothing else sees these pages
    assert loaded["w"][0, 0] == 7.0


@linux_only
def test_a_load_torch_maps_holds_its_memfd_until_the_tensors_go(bucket: str) -> None:
    # weights_only=False is torch.load's own (mapped) path.
    uri = saved(bucket)
    before = open_fds()
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=False)
    assert torch.equal(loaded["w"], state()["w"]) and loaded["step"] == 4
    # torch's mapping of the memfd holds the tensors; no descriptor stays open.
    assert memfd_mappings() >= 1 and open_fds() == before
    del loaded
    gc.collect()
    assert memfd_mappings() == 0


@linux_only
@pytest.mark.parametrize("weights_only", [True, False])
def test_corrupt_and_rewritten_checkpoints_fail_on_either_path(
    bucket: str, weights_only: bool
) -> None:
    uri = saved(bucket)
    with pytest.raises(IntegrityError, match="crc32c") as corrupt:
        on(FlippingStore(bucket)).load(uri, weights_only=weights_only)
    assert uri in str(corrupt.value)
    with pytest.raises(NotFoundError, match="rewritten") as rewritten:
        on(RewritingStore(bucket)).load(uri, weights_only=weights_only)
    assert uri in str(rewritten.value)
    del corrupt, rewritten  # their tracebacks' frames hold views of the downloads
    gc.collect()
    assert memfd_mappings() == 0


def test_what_weights_only_refuses_gets_torchs_own_message(bucket: str) -> None:
    checkpoint = BucketCheckpoint(config=CONFIG)
    uri = f"memory://{bucket}/custom.pt"
    checkpoint.save({"w": torch.arange(3), "custom": Custom(5)}, uri)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        checkpoint.load(uri, weights_only=True)
    loaded = checkpoint.load(uri, weights_only=False)
    assert loaded["custom"].value == 5 and torch.equal(loaded["w"], torch.arange(3))


@linux_only
def test_mmap_false_loads_through_the_reader_without_a_mapping(bucket: str) -> None:
    uri = saved(bucket)
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=True, mmap=False)
    assert torch.equal(loaded["w"], state()["w"])
    assert memfd_mappings() == 0


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_legacy_checkpoint_falls_back_with_one_debug_line(
    bucket: str, caplog: pytest.LogCaptureFixture, weights_only: bool
) -> None:
    checkpoint = BucketCheckpoint(config=CONFIG)
    uri = f"memory://{bucket}/legacy.pt"
    with checkpoint.writer(uri) as f:
        torch.save({"x": torch.arange(6)}, f, _use_new_zipfile_serialization=False)
    with caplog.at_level(logging.DEBUG, logger="torchbucket.checkpoint"):
        assert torch.equal(checkpoint.load(uri, weights_only=weights_only)["x"], torch.arange(6))
    lines = [r for r in caplog.records if r.name.startswith("torchbucket.checkpoint")]
    assert len(lines) == 1 and "cannot map" in lines[0].getMessage()
    assert lines[0].levelno == logging.DEBUG and uri in lines[0].getMessage()


@pytest.mark.skipif(os.name != "posix", reason="a temporary file torch maps: POSIX")
def test_without_memfd_an_unlinked_temporary_file_backs_the_load(
    bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(mapped, "_has_memfd", lambda: False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    uri = saved(bucket)
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=False)
    assert torch.equal(loaded["w"], state()["w"])
    assert list(tmp_path.iterdir()) == []  # unlinked once torch mapped it
    with pytest.raises(IntegrityError):
        on(FlippingStore(bucket)).load(uri, weights_only=False)
    assert list(tmp_path.iterdir()) == []


def _record_crcs(data: bytes) -> list[int]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [info.CRC for info in archive.infolist()]


@pytest.mark.parametrize("keep", [False, True])
def test_save_leaves_out_torchs_unchecked_zip_crc_unless_asked(bucket: str, keep: bool) -> None:
    import torch.serialization as serialization

    if not hasattr(serialization, "get_crc32_options"):
        pytest.skip("torch < 2.6 has no switch for its zip CRC32")
    checkpoint = BucketCheckpoint(config=CheckpointConfig(torch_zip_crc32=keep))
    uri = f"memory://{bucket}/crc.pt"
    checkpoint.save(state(), uri)
    data = runtime.run(MemoryStore(bucket).get("crc.pt"))
    crcs = _record_crcs(data)
    assert all(crcs) if keep else not any(crcs)
    assert serialization.get_crc32_options() is True  # put back
    loaded = checkpoint.load(uri, weights_only=True)
    assert torch.equal(loaded["w"], state()["w"])
