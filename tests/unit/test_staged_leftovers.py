"""Telling a staged checkpoint object's name and age, and cleanup where age is unknown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.checkpoint.staged_names import is_staging_name, staging_key, staging_prefix
from torchbucket.cli import main
from torchbucket.storage import MemoryStore
from torchbucket.storage.gcs._objects import rfc3339_seconds

_SEGMENT = st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=20)


@given(st.lists(_SEGMENT, min_size=1, max_size=4))
def test_every_staging_key_is_a_staging_name(segments: list[str]) -> None:
    assert is_staging_name(staging_key("/".join(segments)))


# Names GCS takes: up to 1,024 bytes of UTF-8, one to four-byte characters.
_LONG_NAME = (
    st.lists(
        st.sampled_from(["a", "/", "é", "中", "\U0001f600", "b" * 40, "/" * 3, "c/" * 20]),
        min_size=1,
        max_size=400,
    )
    .map("".join)
    .filter(lambda n: len(n.encode()) <= 1024 and not n.endswith("/"))
)


@given(_LONG_NAME)
def test_a_staging_key_fits_in_gcs_for_every_name_gcs_takes(key: str) -> None:
    staged = staging_key(key)
    assert len(staged.encode()) <= 1024
    assert is_staging_name(staged)
    assert staged.startswith(staging_prefix(key))  # one prefix per checkpoint, to abort by


def test_a_name_that_fits_stages_beside_itself_and_one_that_does_not_as_a_digest() -> None:
    assert staging_key("run/last.pt").startswith("run/.last.pt.tbtmp-")
    long_key = "run/" + "c" * 1017 + ".pt"
    staged = staging_key(long_key)
    assert staged.startswith("run/.") and "c" * 40 not in staged
    assert staging_prefix(long_key) != staging_prefix(long_key[:-1] + "x")


@pytest.mark.parametrize(
    "name",
    [
        "run/last.pt",
        "run/.last.pt.tbtmp",
        "run/.last.pt.tbtmp-",
        "run/last.pt.tbtmp-0123456789abcdef",
        "run/.last.pt.tbtmp-abc",
        "run/.last.pt.tbtmp-0123456789abcdef0",
        "run/.last.pt.tbtmp-0123456789ABCDEF",
        "run/.last.pt.tbtmp-0123456789abcdef/x",
        "..tbtmp-0123456789abcdef",
    ],
)
def test_lookalikes_are_not_staging_names(name: str) -> None:
    assert not is_staging_name(name)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1970-01-01T00:00:01Z", 1.0),
        ("1970-01-01T00:00:01.250Z", 1.25),
        ("1970-01-01T01:00:01.5+01:00", 1.5),
        ("1970-01-01T00:00:00.123456789Z", 0.123456789),
        ("2024-05-01T12:00:00.000Z", 1714564800.0),
        ("not a time", None),
        ("2024-13-01T00:00:00Z", None),
    ],
)
def test_rfc3339_times(text: str, seconds: float | None) -> None:
    assert rfc3339_seconds(text) == (None if seconds is None else pytest.approx(seconds))


@pytest.fixture
def bucket() -> Iterator[MemoryStore]:
    with memory_bucket("staged") as name:
        yield MemoryStore(name)


def test_a_store_that_cannot_tell_an_age_keeps_staged_objects_under_older_than(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    staged = staging_key("ckpt/e.pt")
    runtime.run(bucket.put(staged, b"x" * 3))
    uri = f"memory://{bucket.bucket}/"
    assert main(["cleanup", "--older-than", "1s", uri]) == 0
    assert capsys.readouterr().out.strip() == f"nothing to clean up in {uri}"
    assert main(["cleanup", uri]) == 0
    out = capsys.readouterr().out
    assert f"removing staged checkpoint object {uri}{staged} (3 B)" in out
    assert runtime.run(bucket.list_page("")).objects == []
