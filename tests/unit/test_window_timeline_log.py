"""The prefetch window's DEBUG timeline: the lines benchmarks/window_timeline.py reads.

An epoch of the iterable dataset over the memory store, compose on, in this
process (no DataLoader): at DEBUG the window logs its start, one line per unit
fetched (a group's with its object count) and each wait of its consumer, and
the epoch's drain logs its time. At INFO it logs none of them.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator

import pytest
from memory_helper import memory_bucket

from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketIterableDataset

N = 300


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("tl", ((f"s/{i:05d}", f"t-{i:05d}".encode()) for i in range(N))) as name:
        yield name


def _epoch(bucket: str) -> list[bytes]:
    ds = BucketIterableDataset.from_prefix(
        f"memory://{bucket}/s/", compose=ComposeConfig(max_sources=8)
    )
    return list(ds)


def test_at_debug_the_window_logs_its_timeline(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="torchbucket")
    assert _epoch(bucket) == [f"t-{i:05d}".encode() for i in range(N)]
    window = [r.getMessage() for r in caplog.records if r.name == "torchbucket.datasets._fetch"]
    # Small objects: prefetch // 2 groups in flight (FetchConfig's 128).
    assert window[0] == f"window start: {N} objects from position 0, 64 groups in flight at most"
    units = [re.match(r"window unit at position (\d+): (\d+) objects in \S+ s", m) for m in window]
    fetched = sorted((int(u.group(1)), int(u.group(2))) for u in units if u)
    # Every position once: a unit's objects follow on from the one before.
    assert sum(n for _, n in fetched) == N
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(fetched))
    # Direct reads first (one object each), then groups of up to 7 (8 less the anchor).
    assert fetched[0] == (0, 1)
    assert max(n for _, n in fetched) == 7
    drains = [r.getMessage() for r in caplog.records if r.name == "torchbucket.compose.registry"]
    assert any(re.match(r"drain \S+ s: \d+ deletes and compose paths", m) for m in drains)


def test_at_info_it_logs_none_of_it(bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torchbucket")
    assert len(_epoch(bucket)) == N
    assert not [r for r in caplog.records if r.getMessage().startswith(("window ", "drain "))]
