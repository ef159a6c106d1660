"""Server-side compose: concatenation, generation pins, the 32-source limit."""

from __future__ import annotations

import pytest

from torchbucket.errors import NotFoundError, PreconditionFailedError
from torchbucket.storage.base import COMPOSE_MAX_SOURCES, ObjectInfo

from .conftest import SyncStore


def test_compose_concatenates_in_order(s: SyncStore) -> None:
    parts = [b"alpha-", b"", b"beta-", b"gamma"]
    infos = [s.put(f"part{i}", p) for i, p in enumerate(parts)]
    out = s.compose("whole", [infos[2], infos[0], infos[3], infos[1]])
    assert out.name == s.k("whole")
    assert out.size == sum(map(len, parts))
    assert s.get("whole") == b"beta-alpha-gamma"
    assert s.head("whole").generation == out.generation


def test_compose_of_unpinned_sources_uses_current_bytes(s: SyncStore) -> None:
    s.put("p", b"old")
    s.put("p", b"new")
    s.compose("whole", [ObjectInfo(s.k("p"), 3), ObjectInfo(s.k("p"), 3)])
    assert s.get("whole") == b"newnew"


def test_compose_with_a_stale_pin_fails_and_writes_nothing(s: SyncStore) -> None:
    stale = s.put("p", b"old")
    s.put("p", b"new")
    other = s.put("q", b"other")
    with pytest.raises((NotFoundError, PreconditionFailedError)) as info:
        s.compose("whole", [other, stale])
    assert s.store.uri(s.k("")) in str(info.value)
    with pytest.raises(NotFoundError):
        s.head("whole")


def test_compose_of_a_missing_source_fails(s: SyncStore) -> None:
    with pytest.raises(NotFoundError):
        s.compose("whole", [ObjectInfo(s.k("missing"), 1)])


def test_compose_source_limit(s: SyncStore) -> None:
    info = s.put("p", b"x")
    assert s.compose("max", [info] * COMPOSE_MAX_SOURCES).size == COMPOSE_MAX_SOURCES
    with pytest.raises(ValueError, match="at most 32"):
        s.compose("too-many", [info] * (COMPOSE_MAX_SOURCES + 1))
    with pytest.raises(ValueError):
        s.compose("none", [])
    with pytest.raises(NotFoundError):
        s.head("too-many")


def test_compose_if_generation_match(s: SyncStore) -> None:
    source = s.put("p", b"x")
    created = s.compose("dst", [source], if_generation_match=0)
    with pytest.raises(PreconditionFailedError):
        s.compose("dst", [source, source], if_generation_match=0)
    s.compose("dst", [source, source], if_generation_match=created.generation)
    assert s.get("dst") == b"xx"
