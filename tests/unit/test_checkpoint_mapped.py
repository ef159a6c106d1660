"""``BucketCheckpoint.load`` through file pages that torch maps (issue 45), on the memory store.

The default load downloads into a memfd (an unlinked temporary file off
Linux) and hands it to ``torch.load(..., mmap=True)``: these tests hold it to
what a load guaranteed before: the CRC32C of every byte, ranges pinned to one
generation, no descriptor or file left behind; and check that the tensors
really are the downloaded pages, that what torch cannot map falls back with
one DEBUG line, and that ``save`` leaves out torch's unchecked zip CRC32.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import sys
import zipfile
from typing import Any

import pytest
import torch
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint import _mapped as mapped
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


@linux_only
def test_loaded_tensors_are_the_downloaded_pages_until_they_go(bucket: str) -> None:
    uri = saved(bucket)
    before = open_fds()
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=True)
    assert torch.equal(loaded["w"], state()["w"]) and loaded["step"] == 4
    # torch's mapping of the memfd holds the tensors; no descriptor stays open.
    assert memfd_mappings() >= 1 and open_fds() == before
    del loaded
    gc.collect()
    assert memfd_mappings() == 0


@linux_only
def test_mmap_false_loads_through_the_reader_without_a_mapping(bucket: str) -> None:
    uri = saved(bucket)
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=True, mmap=False)
    assert torch.equal(loaded["w"], state()["w"])
    assert memfd_mappings() == 0


def test_a_legacy_checkpoint_falls_back_with_one_debug_line(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = BucketCheckpoint(config=CONFIG)
    uri = f"memory://{bucket}/legacy.pt"
    with checkpoint.writer(uri) as f:
        torch.save({"x": torch.arange(6)}, f, _use_new_zipfile_serialization=False)
    with caplog.at_level(logging.DEBUG, logger="torchbucket.checkpoint._mapped"):
        assert torch.equal(checkpoint.load(uri, weights_only=True)["x"], torch.arange(6))
    lines = [r for r in caplog.records if r.name == "torchbucket.checkpoint._mapped"]
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
    loaded = BucketCheckpoint(config=CONFIG).load(uri, weights_only=True)
    assert torch.equal(loaded["w"], state()["w"])
    assert list(tmp_path.iterdir()) == []  # unlinked once torch mapped it
    with pytest.raises(IntegrityError):
        on(FlippingStore(bucket)).load(uri, weights_only=True)
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
