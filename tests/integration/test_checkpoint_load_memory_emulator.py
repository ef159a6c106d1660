"""Over HTTP: a load holds the checkpoint once, and bytes read again come from the bucket again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.checkpoint._consumed import supported
from torchbucket.emulator import Emulator

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(not supported(), reason="pages are given back only on Linux"),
]

MiB = 1 << 20


def state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    out = {f"large.{i}": torch.randn(5 * MiB, generator=g) for i in range(4)}  # 80 MiB
    out |= {f"small.{i}": torch.randn(1000 + i, generator=g) for i in range(100)}
    return out


def test_a_second_torch_load_of_one_reader_reads_the_released_bytes_again(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator, prefix="ckpt-mem")
    checkpoint = BucketCheckpoint(gcs=store.config)
    uri = f"gs://{store.bucket}/run/step-1.pt"
    original = state_dict()
    checkpoint.save(original, uri)
    with checkpoint.reader(uri) as f:
        received = []
        for _ in range(2):
            emulator.reset_stats()
            loaded = torch.load(f, weights_only=True)
            received.append(emulator.stats()["bytes_out"])
            assert loaded.keys() == original.keys()
            assert all(torch.equal(loaded[k], original[k]) for k in original)
            f.seek(0)
    # The first load gave the tensors' pages back as it copied them; the
    # second read them from the bucket again (the same generation).
    assert received[0] == 0
    assert received[1] >= 75 * MiB  # the whole pages inside the tensors' bytes
