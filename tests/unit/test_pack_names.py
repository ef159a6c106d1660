"""``pack`` never writes a tar member that an extractor would put outside its folder."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.errors import ConfigError
from torchbucket.shards import PackConfig, pack
from torchbucket.shards._names import unsafe_reason
from torchbucket.storage.memory import MemoryStore

SAFE = {"raw/cls0/0001.txt": b"one", "raw/cls0/0002.txt": b"two", "raw/top.txt": b"top"}


@pytest.fixture
def bucket() -> Iterator[str]:
    with memory_bucket("pn", SAFE.items()) as name:
        yield name


def _pack(bucket: str) -> None:
    pack(
        f"memory://{bucket}/raw/",
        f"memory://{bucket}/packed/",
        config=PackConfig(group_by="none", shard_size=1 << 20),
        progress=False,
    )


def _names(bucket: str, prefix: str) -> list[str]:
    page = runtime.run(MemoryStore(bucket, create=False).list_page(prefix))
    return [o.name for o in page.objects]


@pytest.mark.parametrize(
    "hostile",
    [
        "raw/../../outside/pwn.txt",
        "raw//abs.txt",
        "raw/a//b.txt",
        "raw/./dot.txt",
        "raw/nul\0.txt",
        "raw/..\\..\\win.txt",
    ],
)
def test_pack_refuses_a_member_name_that_escapes_and_writes_nothing(
    bucket: str, hostile: str
) -> None:
    runtime.run(MemoryStore(bucket, create=False).put(hostile, b"pwned"))

    with pytest.raises(ConfigError) as info:
        _pack(bucket)

    message = str(info.value)
    assert f"memory://{bucket}/{hostile}" in message  # names the object
    assert repr(hostile[len("raw/") :]) in message  # and the member it would become
    assert _names(bucket, "packed/") == []


def test_a_packed_shard_extracts_inside_its_folder(bucket: str, tmp_path: Path) -> None:
    _pack(bucket)
    store = MemoryStore(bucket, create=False)
    data = runtime.run(store.get("packed/shard-000000.tar"))
    target = tmp_path / "extract"
    target.mkdir()

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == ["cls0/0001.txt", "cls0/0002.txt", "top.txt"]
        tar.extractall(target, filter="fully_trusted")  # what a careless user runs

    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert written == [
        "extract",
        "extract/cls0",
        "extract/cls0/0001.txt",
        "extract/cls0/0002.txt",
        "extract/top.txt",
    ]


@pytest.mark.parametrize("name", ["a.txt", "a/b.c/d.png", "..a/b..", "a\\b.txt", "été.jpg"])
def test_ordinary_names_are_safe(name: str) -> None:
    assert unsafe_reason(name) is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("/abs.txt", "absolute"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a//b", "empty"),
        ("a/", "empty"),
        ("./a", "'.'"),
        ("a\0b", "NUL"),
        ("", "empty"),
    ],
)
def test_unsafe_names_say_why(name: str, reason: str) -> None:
    assert reason in (unsafe_reason(name) or "")
