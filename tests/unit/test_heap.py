"""The main process's ``bytes`` of handed-over samples: pages kept, huge pages for large ones."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchbucket._madvise import MADV_HUGEPAGE, madvise
from torchbucket.datasets import _heap

# Batches of 64 samples of 1 MiB made from shared memory, the one before
# freed once the next is made (as a training loop holds its batch while the
# DataLoader unpickles the next); faults counted over the last 8 batches.
_BATCHES = """
import ctypes, json, mmap, resource, sys
from torchbucket.datasets import _heap
if sys.argv[1] == "settle":
    _heap.settle()
size, batch = 1 << 20, 64
source = mmap.mmap(-1, size)
source.write(b"x" * size)
address = ctypes.addressof(ctypes.c_char.from_buffer(source))
held = None
faults = 0
for i in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    made = [_heap.new_bytes(address, size) for _ in range(batch)]
    if i >= 4:
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    held = made
print(json.dumps({"faults_per_mib": faults / (8 * batch)}))
"""


def _faults_per_mib(mode: str, **env: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _BATCHES, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
        timeout=120,
    )
    return float(json.loads(out.stdout.splitlines()[-1])["faults_per_mib"])


@pytest.mark.skipif(not _heap._glibc(), reason="glibc's allocator only")
def test_a_settled_process_keeps_the_pages_of_freed_batches() -> None:
    settled = _faults_per_mib("settle")
    unsettled = _faults_per_mib("leave")
    # The user's own setting wins: a trim threshold of 128 KiB (which also
    # turns glibc's dynamic mmap threshold off) gives every sample fresh pages.
    users = _faults_per_mib("settle", MALLOC_TRIM_THRESHOLD_=str(128 << 10))
    # 256 pages of 4 KiB per MiB: glibc's defaults give half a batch's back
    # to the kernel, so about 128 fault in again; kept, a handful.
    assert settled < 32, (settled, unsettled)
    assert unsettled > 64, (settled, unsettled)
    assert users > 200, users


@pytest.mark.parametrize(
    ("environ", "owner"),
    [
        ({}, None),
        ({"MALLOC_TRIM_THRESHOLD_": "1"}, "MALLOC_TRIM_THRESHOLD_"),
        ({"MALLOC_MMAP_THRESHOLD_": "1"}, "MALLOC_MMAP_THRESHOLD_"),
        ({"MALLOC_TOP_PAD_": "1"}, "MALLOC_TOP_PAD_"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "GLIBC_TUNABLES"),
        ({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}, None),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/opt/libfoo.so"}, None),
    ],
)
def test_a_users_own_allocator_settings_are_left_alone(
    environ: dict[str, str], owner: str | None
) -> None:
    assert _heap._users_own(environ) == owner


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of this process's mapping holding ``address`` (``/proc/self/smaps``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    return []


def _huge_pages_on_request() -> bool:
    try:
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


@pytest.mark.parametrize("size", [(1 << 20) + 7, _heap.MMAP_FROM + (5 << 20) + 3])
def test_new_bytes_is_an_exact_copy(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    advice: list[tuple[int, int, int]] = []

    def recorded(address: int, length: int, flag: int) -> int:
        advice.append((address, length, flag))
        assert madvise is not None
        return madvise(address, length, flag)

    if madvise is not None:
        monkeypatch.setattr(_heap, "madvise", recorded)
    source = mmap.mmap(-1, size)
    source.write(os.urandom(size))
    address = ctypes.addressof(ctypes.c_char.from_buffer(source))
    made = _heap.new_bytes(address, size)
    assert type(made) is bytes
    assert made == source[:]
    start = ctypes.cast(ctypes.c_char_p(made), ctypes.c_void_p).value
    assert start is not None
    # Over MMAP_FROM the 2 MiB-aligned inside is advised MADV_HUGEPAGE (whether
    # the kernel finds huge pages for it is its own affair); a smaller sample
    # is not advised at all. The calls are what is checked for the small one:
    # its block may come from heap pages an earlier large sample of this
    # process had advised and freed, and those keep their flag.
    if size > _heap.MMAP_FROM and madvise is not None:
        first = -(-start // (2 << 20)) * (2 << 20)
        end = (start + size) // (2 << 20) * (2 << 20)
        assert advice == [(first, end - first, MADV_HUGEPAGE)]
        if _huge_pages_on_request():
            assert "hg" in _vm_flags(first)
    else:
        assert advice == []
    del made


def test_a_c_library_without_glibcs_name_is_not_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name!r}")  # musl's Python

    monkeypatch.setattr(os, "confstr", unknown)
    assert _heap._glibc() is False
