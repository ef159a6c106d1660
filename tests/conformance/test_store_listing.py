"""Listing one page at a time: order, pagination, prefixes and offsets."""

from __future__ import annotations

import pytest

from torchbucket.storage import SupportsFolders

from .conftest import SyncStore

NAMES = ["a/1", "a/2", "a/b/3", "a-x", "ab", "b", "c/d/e"]


def _seed(s: SyncStore, names: list[str]) -> None:
    for name in names:
        s.put(name, name.encode())


def test_listing_is_sorted_and_complete_for_every_page_size(s: SyncStore) -> None:
    _seed(s, NAMES)
    for page_size in range(1, len(NAMES) + 2):
        assert s.list_all(page_size=page_size) == sorted(NAMES), page_size


def test_listing_reports_sizes_and_generations(s: SyncStore) -> None:
    infos = {s.k("x"): s.put("x", b"12345"), s.k("y"): s.put("y", b"")}
    page = s.list_page()
    assert {o.name: (o.size, o.generation) for o in page.objects} == {
        name: (info.size, info.generation) for name, info in infos.items()
    }
    assert page.next_page_token is None


def test_prefix(s: SyncStore) -> None:
    _seed(s, NAMES)
    assert s.list_all("a/") == ["a/1", "a/2", "a/b/3"]
    assert s.list_all("a") == ["a-x", "a/1", "a/2", "a/b/3", "ab"]
    assert s.list_all("c/d/") == ["c/d/e"]
    assert s.list_all("a/b/3") == ["a/b/3"]
    assert s.list_all("zzz") == []
    assert s.list_all("a/", page_size=1) == ["a/1", "a/2", "a/b/3"]


def test_missing_prefix_lists_as_empty(s: SyncStore) -> None:
    page = s.list_page("no/such/dir/")
    assert page.objects == []
    assert page.next_page_token is None


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        ("a/2", None, ["a/2", "a/b/3", "ab", "b", "c/d/e"]),
        (None, "ab", ["a-x", "a/1", "a/2", "a/b/3"]),  # "-" sorts before "/"
        ("a/b", "b", ["a/b/3", "ab"]),
        ("b", "b", []),
        ("zz", None, []),
    ],
)
def test_offsets(s: SyncStore, start: str | None, end: str | None, expected: list[str]) -> None:
    _seed(s, NAMES)
    for page_size in (1, 2, 1000):
        got = s.list_all(start_offset=start, end_offset=end, page_size=page_size)
        assert got == expected


def test_offsets_combine_with_a_prefix(s: SyncStore) -> None:
    _seed(s, NAMES)
    assert s.list_all("a/", start_offset="a/2") == ["a/2", "a/b/3"]
    assert s.list_all("a/", end_offset="a/2") == ["a/1"]


def test_order_is_by_code_point_of_the_full_name(s: SyncStore) -> None:
    names = ["é", "z", "Z", "a b", "a/b", "a-b", "a~", "日本", "a.b"]
    _seed(s, names)
    assert s.list_all() == sorted(names)
    assert s.list_all(page_size=2) == sorted(names)


def _list_folder_all(s: SyncStore, prefix: str, page_size: int) -> tuple[list[str], list[str]]:
    """Objects and folders (relative) of one level under ``prefix``, following tokens."""
    assert isinstance(s.store, SupportsFolders)
    objects: list[str] = []
    folders: list[str] = []
    token = None
    while True:
        page = s.run(s.store.list_folder(s.k(prefix), page_token=token, page_size=page_size))
        if s.backend == "gcs-fake":
            # fake-gcs-server counts only objects towards a page and repeats
            # every folder on every page; GCS counts both, once each.
            assert len(page.objects) <= page_size
        else:
            assert len(page.objects) + len(page.prefixes) <= page_size
        objects += [s.rel(o.name) for o in page.objects]
        folders += [s.rel(f) for f in page.prefixes if s.rel(f) not in folders]
        token = page.next_page_token
        if token is None:
            return objects, folders


# The local store lists no folders (the lister does without): not collected there.
@pytest.mark.capability.with_args(SupportsFolders)
def test_list_folder_gives_one_level(s: SyncStore) -> None:
    _seed(s, NAMES)
    for page_size in (1, 2, 1000):
        assert _list_folder_all(s, "", page_size) == (["a-x", "ab", "b"], ["a/", "c/"])
        assert _list_folder_all(s, "a/", page_size) == (["a/1", "a/2"], ["a/b/"])
        assert _list_folder_all(s, "c/", page_size) == ([], ["c/d/"])
        assert _list_folder_all(s, "zzz/", page_size) == ([], [])


@pytest.mark.capability.with_args(SupportsFolders)
def test_list_folder_reports_sizes(s: SyncStore) -> None:
    assert isinstance(s.store, SupportsFolders)
    info = s.put("f/x", b"12345")
    s.put("f/g/y", b"")
    page = s.run(s.store.list_folder(s.k("f/")))
    assert [(o.name, o.size, o.generation) for o in page.objects] == [
        (info.name, 5, info.generation)
    ]
    assert page.prefixes == [s.k("f/g/")]
    assert page.next_page_token is None
