"""The shared-memory segment pool of DataLoader workers (``datasets._shm``), in one process.

The pool is exercised here under the ``file_system`` strategy, set for each
test and restored after it; another process mapping a segment is played by
``_shared_incref`` (what torch's pickler does before a handle leaves the
worker). Workers reusing segments across processes are tested over the
emulator in ``tests/integration/test_shm_reuse_emulator.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

from torchbucket.datasets import FetchConfig, _shm
from torchbucket.errors import ConfigError

KIB = 1024


@pytest.fixture
def file_system() -> Iterator[None]:
    before = mp.get_sharing_strategy()  # type: ignore[no-untyped-call]
    mp.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        mp.set_sharing_strategy(before)  # type: ignore[no-untyped-call]


def test_the_count_is_where_the_pool_reads_it(file_system: None) -> None:
    assert _shm._self_test() is None


def test_a_wrong_place_for_the_count_is_reported(
    file_system: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_shm, "_HEADER", 128)
    why = _shm._self_test()
    assert why is not None and "[-1, -1, -1]" in why


def test_a_segment_is_reused_only_once_nothing_holds_it(file_system: None) -> None:
    pool = _shm.SegmentPool()
    first = pool.tensor(100 * KIB)
    first.fill_(7)
    assert first.is_shared() and first.numel() == 100 * KIB
    # Held in this process: a second tensor gets a segment of its own.
    second = pool.tensor(100 * KIB)
    assert second.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
    assert (pool.made, pool.reused) == (2, 0)
    ptr = first.untyped_storage().data_ptr()
    storage = first.untyped_storage()
    del first
    # Another process maps it (a handle sent): still not free.
    storage._shared_incref()  # type: ignore[no-untyped-call]
    third = pool.tensor(100 * KIB)
    assert third.untyped_storage().data_ptr() != ptr
    assert (pool.made, pool.reused) == (3, 0)
    # That process let go, and nothing here holds it but the pool: reused,
    # as it was (its bytes are whatever it held).
    storage._shared_decref()  # type: ignore[no-untyped-call]
    del storage
    again = pool.tensor(100 * KIB)
    assert again.untyped_storage().data_ptr() == ptr
    assert (pool.made, pool.reused) == (3, 1)
    assert int(again[0]) == 7
    del second, third


def test_a_view_held_anywhere_in_the_worker_keeps_its_segment(file_system: None) -> None:
    pool = _shm.SegmentPool()
    tensor = pool.tensor(64 * KIB)
    piece = tensor[10:20]  # a sample cut from a composite
    del tensor
    assert pool.tensor(64 * KIB).untyped_storage().data_ptr() != piece.untyped_storage().data_ptr()
    assert pool.reused == 0


def test_sizes_fit_a_segment_up_to_twice_their_own(file_system: None) -> None:
    pool = _shm.SegmentPool()
    pool.tensor(1000 * KIB)  # dropped at once: free
    assert pool.tensor(300 * KIB).untyped_storage().nbytes() != _shm._capacity(1000 * KIB)
    assert pool.tensor(600 * KIB).untyped_storage().nbytes() == _shm._capacity(1000 * KIB)
    assert pool.reused == 1
    # Larger than the segment: a new one.
    assert pool.tensor(1100 * KIB).numel() == 1100 * KIB


@given(st.integers(min_value=1, max_value=1 << 36))
def test_capacity_rounds_up_by_at_most_a_quarter_or_64_kib(size: int) -> None:
    cap = _shm._capacity(size)
    assert cap >= size
    assert cap - size < max(64 * KIB, size / 4)
    assert cap % (64 * KIB) == 0


def test_free_segments_beyond_the_idle_cap_are_let_go(file_system: None) -> None:
    pool = _shm.SegmentPool(idle_bytes_most=256 * KIB)
    held = [pool.tensor(128 * KIB) for _ in range(6)]
    assert pool.tracked() == 6
    del held  # all six free now: 768 KiB idle
    big = pool.tensor(4096 * KIB)  # fits none: made, and the idle ones trimmed first
    assert pool.tracked() == 3  # two of 128 KiB kept (256 KiB) and the new one
    del big


def test_the_pool_tracks_at_most_its_cap(file_system: None) -> None:
    pool = _shm.SegmentPool(tracked_most=4)
    held = [pool.tensor(64 * KIB) for _ in range(10)]
    assert pool.tracked() == 4
    # The forgotten ones stay the holders' own: none was handed out twice.
    for i, tensor in enumerate(held):
        tensor.fill_(i)
    assert [int(t[-1]) for t in held] == list(range(10))
    assert len({t.data_ptr() for t in held}) == 10


def test_enable_outside_a_dataloader_worker_changes_nothing() -> None:
    before = mp.get_sharing_strategy()  # type: ignore[no-untyped-call]
    _shm.enable()
    assert mp.get_sharing_strategy() == before  # type: ignore[no-untyped-call]
    assert _shm.pool() is None


def test_reuse_shared_memory_is_off_by_default_and_must_be_a_bool() -> None:
    assert FetchConfig().reuse_shared_memory is False
    with pytest.raises(ConfigError, match="reuse_shared_memory must be a bool"):
        FetchConfig(reuse_shared_memory=1)  # type: ignore[arg-type]


def test_a_fresh_segment_is_mapped_in_and_zeroed(file_system: None) -> None:
    tensor = _shm.SegmentPool().tensor(256 * KIB)
    assert torch.count_nonzero(tensor) == 0


def _name(tensor: torch.Tensor) -> str:
    handle = tensor.untyped_storage()._share_filename_cpu_()[1]  # type: ignore[no-untyped-call]
    return "/dev/shm" + handle.decode()


def test_release_counts_the_worker_out_and_removes_the_names_nobody_maps(
    file_system: None,
) -> None:
    pool = _shm.SegmentPool()
    free = pool.tensor(64 * KIB)  # handed out and dropped everywhere
    held = pool.tensor(64 * KIB)  # still held in the worker (a window's object)
    sent = pool.tensor(64 * KIB)  # mapped by the main process too
    names = {"free": _name(free), "held": _name(held), "sent": _name(sent)}
    sent.untyped_storage()._shared_incref()  # type: ignore[no-untyped-call]
    del free
    assert all(os.path.exists(n) for n in names.values())
    pool.release()
    assert pool.tracked() == 0
    assert not os.path.exists(names["free"])  # freed with the pool's reference
    assert not os.path.exists(names["held"])  # counted down by hand: nobody else
    assert os.path.exists(names["sent"])  # the main process's mapping keeps it
    assert _shm._count(sent) == 1
    # The main process's part, played here: its count goes and the name with it.
    sent.untyped_storage()._shared_decref()  # type: ignore[no-untyped-call]
    os.unlink(names["sent"])
    del held, sent  # their close counts below zero: torch removes nothing more
