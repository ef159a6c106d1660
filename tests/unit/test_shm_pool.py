"""The shared-memory segment pool of DataLoader workers (``datasets._shm``), in one process.

The reader (the main process) is played here by :func:`_shm._open` in the same
process: it opens the segment through ``/proc/<pid>/fd`` as another process
would, which gives it an open file description and an OFD lock of its own.
Workers reusing segments across processes are tested over the emulator in
``tests/integration/test_shm_reuse_emulator.py``.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

from torchbucket.datasets import FetchConfig, _shm
from torchbucket.errors import ConfigError

KIB = 1024


def _send(pool: _shm.SegmentPool, tensor: torch.Tensor) -> tuple[int, int, int, int]:
    """What the worker's pickler does with a pooled tensor's storage."""
    rebuild, handle = _shm._reduce_storage_with(pool, tensor.untyped_storage())
    assert rebuild is _shm._open
    return handle  # type: ignore[return-value]


def test_segments_can_be_handed_over_and_tracked_here() -> None:
    assert _shm._self_test() is None


def test_a_segment_is_reused_only_once_nothing_holds_it() -> None:
    pool = _shm.SegmentPool()
    first = pool.tensor(100 * KIB)
    first.fill_(7)
    assert first.is_shared() and first.numel() == 100 * KIB
    base = first.untyped_storage().data_ptr()
    # Held in this process: a second tensor gets a segment of its own.
    second = pool.tensor(100 * KIB)
    assert second.untyped_storage().data_ptr() != base
    assert (pool.made, pool.reused) == (2, 0)
    handle = _send(pool, first)
    del first
    # Sent and not yet opened by the reader: not free.
    third = pool.tensor(100 * KIB)
    assert third.untyped_storage().data_ptr() != base
    # Opened: the reader's lock keeps it.
    reader = _shm._open(*handle)
    assert bytes(reader[_shm._HEADER : _shm._HEADER + 3]) == b"\x07\x07\x07"
    fourth = pool.tensor(100 * KIB)
    assert fourth.untyped_storage().data_ptr() != base
    assert (pool.made, pool.reused) == (4, 0)
    # The reader let go, and nothing here holds it but the pool: reused, as
    # it was (its bytes are whatever it held).
    del reader
    again = pool.tensor(100 * KIB)
    assert again.untyped_storage().data_ptr() == base
    assert (pool.made, pool.reused) == (4, 1)
    assert int(again[0]) == 7
    del second, third, fourth


def test_a_segment_sent_twice_is_busy_until_the_second_handle_is_opened() -> None:
    # A composite's objects can go out in two batches: the reader may drop the
    # first batch before the second reaches it.
    pool = _shm.SegmentPool()
    tensor = pool.tensor(64 * KIB)
    base = tensor.untyped_storage().data_ptr()
    first = _send(pool, tensor[:10])
    second = _send(pool, tensor[10:])
    del tensor
    reader = _shm._open(*first)
    del reader
    assert pool.tensor(64 * KIB).untyped_storage().data_ptr() != base
    reader = _shm._open(*second)
    del reader
    assert pool.tensor(64 * KIB).untyped_storage().data_ptr() == base


def test_a_second_handle_to_a_segment_the_reader_holds_maps_it_once() -> None:
    pool = _shm.SegmentPool()
    tensor = pool.tensor(64 * KIB)
    base = tensor.untyped_storage().data_ptr()
    one = _shm._open(*_send(pool, tensor[:10]))
    two = _shm._open(*_send(pool, tensor[10:]))
    assert one.data_ptr() == two.data_ptr()
    del one, two, tensor
    assert pool.tensor(64 * KIB).untyped_storage().data_ptr() == base


def test_a_reader_lock_held_by_a_child_process_keeps_the_segment() -> None:
    # torch passes a received storage on by descriptor, and a fork inherits
    # descriptors: the lock lasts as long as any of them.
    pool = _shm.SegmentPool()
    tensor = pool.tensor(64 * KIB)
    base = tensor.untyped_storage().data_ptr()
    reader = _shm._open(*_send(pool, tensor))
    del tensor
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child holds the reader's mapping and descriptor until told
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        del reader
        assert pool.tensor(64 * KIB).untyped_storage().data_ptr() != base
    finally:
        os.write(write, b"x")
        os.close(write)
        os.waitpid(pid, 0)
    assert pool.tensor(64 * KIB).untyped_storage().data_ptr() == base


def test_a_storage_not_from_the_pool_goes_torchs_way() -> None:
    pool = _shm.SegmentPool()
    other = torch.UntypedStorage._new_shared(4096)  # type: ignore[no-untyped-call]
    rebuild, _ = _shm._reduce_storage_with(pool, other)
    assert rebuild is not _shm._open
    assert pool.handle(other) is None


def test_a_handle_that_cannot_be_opened_names_the_setting() -> None:
    with pytest.raises(RuntimeError, match=r"reuse_shared_memory=False"):
        _shm._open(os.getpid(), 1_000_000, 12345, 4096)
    pool = _shm.SegmentPool()
    tensor = pool.tensor(64 * KIB)
    pid, fd, token, nbytes = _send(pool, tensor)
    with pytest.raises(RuntimeError, match="is not the shared-memory segment"):
        _shm._open(pid, fd, token + 2, nbytes)


def test_a_view_held_anywhere_in_the_worker_keeps_its_segment() -> None:
    pool = _shm.SegmentPool()
    tensor = pool.tensor(64 * KIB)
    piece = tensor[10:20]  # a sample cut from a composite
    del tensor
    assert pool.tensor(64 * KIB).untyped_storage().data_ptr() != piece.untyped_storage().data_ptr()
    assert pool.reused == 0


def test_sizes_fit_a_segment_up_to_twice_their_own() -> None:
    pool = _shm.SegmentPool()
    pool.tensor(1000 * KIB)  # dropped at once: free
    capacity = _shm._capacity(1000 * KIB) + _shm._HEADER
    assert pool.tensor(300 * KIB).untyped_storage().nbytes() != capacity
    assert pool.tensor(600 * KIB).untyped_storage().nbytes() == capacity
    assert pool.reused == 1
    # Larger than the segment: a new one.
    assert pool.tensor(1100 * KIB).numel() == 1100 * KIB


@given(st.integers(min_value=1, max_value=1 << 36))
def test_capacity_rounds_up_by_at_most_a_quarter_or_64_kib(size: int) -> None:
    cap = _shm._capacity(size)
    assert cap >= size
    assert cap - size < max(64 * KIB, size / 4)
    assert cap % (64 * KIB) == 0


def test_free_segments_beyond_the_idle_cap_are_let_go() -> None:
    pool = _shm.SegmentPool(idle_bytes_most=256 * KIB)
    held = [pool.tensor(128 * KIB) for _ in range(6)]
    assert pool.tracked() == 6
    del held  # all six free now: 768 KiB idle
    big = pool.tensor(4096 * KIB)  # fits none: made, and the idle ones trimmed first
    assert pool.tracked() == 3  # two of 128 KiB kept (256 KiB) and the new one
    del big


def test_the_pool_forgets_past_its_cap_only_segments_that_readers_alone_hold() -> None:
    # Views still held in the worker (a batch being read, not yet sent) are
    # never forgotten: each is still sent by handle, past the cap.
    pool = _shm.SegmentPool(tracked_most=4)
    held = [pool.tensor(64 * KIB) for _ in range(10)]
    assert pool.tracked() == 10
    for tensor in held:
        assert _shm._reduce_storage_with(pool, tensor.untyped_storage())[0] is _shm._open
    # Once a reader has opened them and the worker let go, the oldest are forgotten
    # past the cap; the readers keep theirs, and none was handed out twice.
    pool = _shm.SegmentPool(tracked_most=4)
    readers = []
    for i in range(10):
        tensor = pool.tensor(64 * KIB)
        tensor.fill_(i)
        handle = _send(pool, tensor)
        readers.append(_shm._open(*handle))
        del tensor
    assert pool.tracked() == 4
    assert [bytes(r[_shm._HEADER : _shm._HEADER + 1]) for r in readers] == [
        bytes([i]) for i in range(10)
    ]
    assert len({r.data_ptr() for r in readers}) == 10
    # A segment whose handle no reader has opened yet keeps its descriptor
    # (the handle names it), however old.
    pool = _shm.SegmentPool(tracked_most=2)
    sent = pool.tensor(64 * KIB)
    base = sent.untyped_storage().data_ptr()
    handle = _send(pool, sent)
    del sent
    rest = [pool.tensor(64 * KIB) for _ in range(3)]
    assert pool.tracked() == 4  # the one in flight and three held here
    del rest
    big = pool.tensor(1024 * KIB)  # fits none: made, and the cap applied
    assert pool.tracked() == 2
    assert base in {s.base for s in pool._segments}
    del big
    assert bytes(_shm._open(*handle)[: _shm._HEADER + 1])[-1:] == b"\x00"


def test_enable_outside_a_dataloader_worker_changes_nothing() -> None:
    before = mp.get_sharing_strategy()  # type: ignore[no-untyped-call]
    _shm.enable()
    assert mp.get_sharing_strategy() == before  # type: ignore[no-untyped-call]
    assert _shm.pool() is None
    # The pickler of this process still sends storages torch's way.
    reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
    assert reducers.get(torch.UntypedStorage) is not _shm._reduce_storage


def test_reuse_shared_memory_is_off_by_default_and_must_be_a_bool() -> None:
    assert FetchConfig().reuse_shared_memory is False
    with pytest.raises(ConfigError, match="reuse_shared_memory must be True or False"):
        FetchConfig(reuse_shared_memory=1)  # type: ignore[arg-type]


def test_a_fresh_segment_is_mapped_in_and_zeroed_and_has_no_name() -> None:
    tensor = _shm.SegmentPool().tensor(256 * KIB)
    assert torch.count_nonzero(tensor) == 0
    with open("/proc/self/maps") as maps:
        mapped = [line.split()[-2:] for line in maps if "torchbucket-segment" in line]
    assert mapped and all(name.startswith("/memfd:") for name, _ in mapped), mapped
    del tensor
