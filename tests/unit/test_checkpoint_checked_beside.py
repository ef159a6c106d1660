"""``download(..., then=...)``: the load runs beside the CRC32C pass, and counts only if it matches.

The default checkpoint load unpickles while another thread checksums the
download (issue 45); what it made of the bytes is returned, or what it raised
is raised, only once every byte matched the object's CRC32C. On a mismatch
it is dropped, the bytes read again, and the load runs again on them.
"""

from __future__ import annotations

import gc
import threading
import uuid
import weakref
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.checkpoint import _reader
from torchbucket.checkpoint._reader import download
from torchbucket.checkpoint.config import CheckpointConfig
from torchbucket.errors import IntegrityError
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.crc32c import Crc32c
from torchbucket.storage.memory import MemoryStore

DATA = bytes(range(256)) * 4096  # 1 MiB
CONFIG = CheckpointConfig(range_size=256 << 10, reads_in_flight=1)


class DamagingStore(MemoryStore):
    """A memory store whose first ``damaged`` ranged reads come back with a byte flipped."""

    def __init__(self, bucket: str, damaged: int) -> None:
        super().__init__(bucket)
        self.damaged = damaged
        self.reads = 0

    async def get_into(self, key: str, buffer: memoryview, **kwargs: Any) -> int:
        got: int = await super().get_into(key, buffer, **kwargs)
        self.reads += 1
        if self.reads <= self.damaged:
            buffer[0] ^= 0xFF
        return got


def saved(damaged: int = 0) -> tuple[DamagingStore, ObjectInfo]:
    store = DamagingStore(f"beside-{uuid.uuid4().hex[:8]}", damaged)
    return store, runtime.run(store.put("ckpt", DATA))


def test_then_runs_while_the_checksum_is_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checksum pass waits (up to 10 s) for then() to have started: one
    # after the other, it would find it not started and say so.
    started = threading.Event()
    seen: list[bool] = []

    class WaitingCrc32c(Crc32c):
        def update(self, data: Any) -> None:
            seen.append(started.wait(10))
            super().update(data)

    monkeypatch.setattr(_reader, "Crc32c", WaitingCrc32c)
    store, info = saved()
    buffer = memoryview(bytearray(info.size))

    def then() -> bytes:
        started.set()
        return bytes(buffer[:4])

    assert download(store, "ckpt", info, buffer, CONFIG, then=then) == DATA[:4]
    assert seen == [True]
    assert bytes(buffer) == DATA


def test_what_then_made_of_damaged_bytes_is_dropped_and_made_again() -> None:
    store, info = saved(damaged=1)  # the first range of the first pass
    buffer = memoryview(bytearray(info.size))
    calls: list[bytes] = []

    def then() -> bytes:
        calls.append(bytes(buffer[:1]))
        if buffer[0] != DATA[0]:
            raise ValueError("not a checkpoint")  # what torch says of a damaged header
        return bytes(buffer)

    assert download(store, "ckpt", info, buffer, CONFIG, then=then) == DATA
    assert calls == [bytes([DATA[0] ^ 0xFF]), DATA[:1]]
    assert store.reads == 2 * (len(DATA) // CONFIG.range_size)


def test_bytes_damaged_on_every_read_raise_the_integrity_error_not_what_then_raised() -> None:
    store, info = saved(damaged=10**9)
    calls = 0

    def then() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("not a checkpoint")

    with pytest.raises(IntegrityError, match="crc32c") as caught:
        download(store, "ckpt", info, memoryview(bytearray(info.size)), CONFIG, then=then)
    assert caught.value.uri == store.uri("ckpt")
    assert calls == 2


def test_what_then_raised_over_matching_bytes_is_raised() -> None:
    store, info = saved()

    def then() -> None:
        raise ValueError("weights_only refused it")

    with pytest.raises(ValueError, match="weights_only refused it"):
        download(store, "ckpt", info, memoryview(bytearray(info.size)), CONFIG, then=then)


def test_without_a_check_then_runs_once_on_the_bytes() -> None:
    store, info = saved(damaged=1)
    buffer = memoryview(bytearray(info.size))
    unchecked = CheckpointConfig(range_size=CONFIG.range_size, verify_crc32c=False)
    assert download(
        store, "ckpt", info, buffer, unchecked, then=lambda: bytes(buffer[:1])
    ) == bytes([DATA[0] ^ 0xFF])
    assert store.reads == len(DATA) // CONFIG.range_size


class Held(bytearray):
    """A download buffer a weak reference can watch."""


def test_what_then_raised_leaves_no_cycle_holding_the_download() -> None:
    # Frames of a raised error hold the buffer; were the error also held by a
    # variable of one of them, that cycle would keep a checkpoint-sized
    # download alive until the garbage collector ran.
    store, info = saved()

    def then() -> None:
        raise ValueError("weights_only refused it")

    gc.collect()
    gc.disable()
    try:
        held = Held(info.size)
        watch = weakref.ref(held)
        with pytest.raises(ValueError):
            download(store, "ckpt", info, memoryview(held), CONFIG, then=then)
        del held
        assert watch() is None
    finally:
        gc.enable()
