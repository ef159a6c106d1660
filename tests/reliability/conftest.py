"""Fixtures of the reliability suite: fresh buckets on an emulator (see _workloads)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from _workloads import Bucket

from torchbucket.emulator import Emulator


@pytest.fixture
def model_bucket(emulator: Emulator) -> Iterator[Bucket]:
    """A fresh bucket on the test's model-store emulator: regional, or zonal (over
    gRPC) in the second run of a test ``tests/bucket_kinds.py`` lists."""
    name = f"rel-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    yield Bucket(emulator, name)


@pytest.fixture
def make_bucket() -> Callable[[Emulator], Bucket]:
    """``make(emu) -> Bucket``: a fresh bucket on any emulator."""

    def make(emu: Emulator) -> Bucket:
        name = f"rel-{uuid.uuid4().hex[:16]}"
        emu.create_bucket(name)
        return Bucket(emu, name)

    return make
