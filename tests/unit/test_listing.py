"""The parallel listing on the memory store: complete, sorted, unique, cheap."""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import random
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.errors import (
    ConfigError,
    DeadlineExceededError,
    PermissionDeniedError,
    StorageError,
    TransientError,
)
from torchbucket.listing import ListingConfig, ListingStats, alist_objects, list_objects
from torchbucket.listing._manifest import ManifestLocation
from torchbucket.listing._probes import AHEAD_PIECES, counted_up
from torchbucket.listing._ranges import Planner, Range
from torchbucket.storage.base import ListPage, ObjectInfo
from torchbucket.storage.memory import MemoryStore

QUIET = ListingConfig(progress=False)


class CountingStore:
    """Wraps a store: counts list calls, can shorten pages and fail one."""

    def __init__(
        self,
        inner: Any,
        *,
        max_page: int | None = None,
        fail_call: int | None = None,
        error: StorageError | None = None,
        classes: dict[str, str] | None = None,
        latency: float = 0.0,
    ) -> None:
        self.inner = inner
        self.max_page = max_page
        self.fail_call = fail_call
        self.error = error
        self.classes = classes or {}
        self.latency = latency
        self.calls = 0
        self.queries: list[tuple[str | None, str | None, bool]] = []

    @property
    def bucket(self) -> str:
        return str(self.inner.bucket)

    def uri(self, key: str = "") -> str:
        return str(self.inner.uri(key))

    async def list_page(self, prefix: str = "", **kw: Any) -> ListPage:
        self.calls += 1
        self.queries.append(
            (kw.get("start_offset"), kw.get("end_offset"), bool(kw.get("page_token")))
        )
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.fail_call is not None and self.calls >= self.fail_call:
            raise self.error or TransientError("injected", operation="list", uri=self.uri(prefix))
        if self.max_page is not None:
            kw["page_size"] = min(kw.get("page_size", 1000), self.max_page)
        page: ListPage = await self.inner.list_page(prefix, **kw)
        if self.classes:
            objects = [
                replace(o, storage_class=self.classes.get(o.name, o.storage_class))
                for o in page.objects
            ]
            page = ListPage(objects, page.next_page_token)
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(autouse=True)
def _no_repairs() -> Iterable[None]:
    """The listers' ranges never overlap: the final merge never has to repair."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    lister_log = logging.getLogger("torchbucket.listing._lister")
    lister_log.addHandler(handler)
    try:
        yield
    finally:
        lister_log.removeHandler(handler)
    assert [r.getMessage() for r in records] == []


@pytest.fixture
def bucket() -> Iterator[MemoryStore]:
    with memory_bucket("listing") as name:
        yield MemoryStore(name)


def seed(store: MemoryStore, names: Iterable[str]) -> None:
    async def put_all() -> None:
        for name in sorted(names):
            await store.put(name, b"x")

    runtime.run(put_all())


def names_of(objects: list[ObjectInfo]) -> list[str]:
    return [o.name for o in objects]


def listing(
    store: Any, prefix: str = "", config: ListingConfig = QUIET, **kw: Any
) -> list[ObjectInfo]:
    return runtime.run(alist_objects(store, prefix, config=config, **kw))


# -- shapes of prefixes -------------------------------------------------------


def test_one_object_costs_one_request(bucket: MemoryStore) -> None:
    seed(bucket, ["data/only"])
    counting = CountingStore(bucket)
    objects = listing(counting, "data/")
    assert names_of(objects) == ["data/only"]
    assert objects[0].size == 1 and objects[0].generation is not None
    assert counting.calls == 1


def test_exactly_one_page_costs_one_request(bucket: MemoryStore) -> None:
    names = [f"p/{i:03d}" for i in range(10)]
    seed(bucket, names)
    counting = CountingStore(bucket)
    assert names_of(listing(counting, "p/", replace(QUIET, objects_per_page=10))) == names
    assert counting.calls == 1


def test_a_page_plus_one(bucket: MemoryStore) -> None:
    names = [f"p/{i:03d}" for i in range(11)]
    seed(bucket, names)
    counting = CountingStore(bucket)
    assert names_of(listing(counting, "p/", replace(QUIET, objects_per_page=10))) == names
    # The first page, its continuation, and two probes past it (near the end
    # of the key space and midway), which come back empty.
    assert counting.calls <= 4


def test_nothing_under_the_prefix_is_an_empty_list(bucket: MemoryStore) -> None:
    seed(bucket, ["other/a", "pre"])
    counting = CountingStore(bucket)
    assert listing(counting, "pre/") == []
    assert counting.calls == 1


def test_empty_prefix_lists_the_whole_bucket(bucket: MemoryStore) -> None:
    names = ["a", "b/c", "dataflux-composed-objects/x", "z/y/x", "~tilde"]
    seed(bucket, names)
    assert names_of(listing(bucket, "", replace(QUIET, objects_per_page=2))) == [
        "a",
        "b/c",
        "z/y/x",
        "~tilde",
    ]


def _hashed(i: int) -> str:
    import hashlib

    return hashlib.blake2b(str(i).encode(), digest_size=8).hexdigest()


# Names counted up and names spread (hashes): the two shapes a key range holds.
NAME_SHAPES = pytest.mark.parametrize(
    "make",
    [lambda i: f"img/{i:06d}.jpg", lambda i: f"img/{_hashed(i)}.jpg"],
    ids=["sequential", "hashed"],
)


@NAME_SHAPES
def test_hundred_thousand_objects(bucket: MemoryStore, make: Any) -> None:
    names = sorted(make(i) for i in range(100_000))
    seed(bucket, names)
    counting = CountingStore(bucket)
    stats = ListingStats()
    objects = listing(counting, "img/", stats=stats)
    assert names_of(objects) == names
    sequential_pages = 100_000 // 1000 + 1
    assert counting.calls == stats.requests
    assert counting.calls <= 1.3 * sequential_pages
    assert stats.ranges > 1  # it did list in parallel


class RoundCountingStore(CountingStore):
    """Counts round trips: a request's round is one more than the latest answered before it."""

    def __init__(self, inner: Any, **kw: Any) -> None:
        super().__init__(inner, **kw)
        self.answered_round = 0
        self.rounds: list[int] = []

    async def list_page(self, prefix: str = "", **kw: Any) -> ListPage:
        round_ = self.answered_round + 1
        self.rounds.append(round_)
        page = await super().list_page(prefix, **kw)
        self.answered_round = max(self.answered_round, round_)
        return page


@NAME_SHAPES
def test_the_listing_fans_out_in_its_second_or_third_round(bucket: MemoryStore, make: Any) -> None:
    # Counted names: the first page, then probes that find where the names
    # are (the midway one, not a search after an empty far one, a round
    # later), then pieces of a page each. Spread names: pieces of a page each
    # right past the first page go with the far probe.
    names = sorted(make(i) for i in range(20_000))
    seed(bucket, names)
    counting = RoundCountingStore(bucket, latency=0.01)
    assert names_of(listing(counting, "img/", replace(QUIET, objects_per_page=200))) == names
    per_round = collections.Counter(counting.rounds)
    fanned_out = min(r for r, n in per_round.items() if n >= 8)
    assert fanned_out <= (3 if counted_up(names[:200]) else 2), sorted(per_round.items())


def test_the_far_probe_goes_first_and_its_names_cut_the_range_below_at_once() -> None:
    # After a first page of hashed names: pieces past it and a far probe, all
    # cut off the top range (labelled so: their hits raise its probe budget).
    names = sorted(f"img/{_hashed(i)}.jpg" for i in range(100_000))
    page = [ObjectInfo(n, 1) for n in names[:1000]]
    stats = ListingStats()
    plan = Planner("img/", parallelism=64, page_size=1000, stats=stats, on_page=None)
    root = Range(start=None, end=None, prefix="img/")
    plan.ranges.append(root)
    plan.take(root, page)
    plan.plan()
    probes = list(plan.probes)
    assert len(probes) > 8 and all(p.probe == "top" for p in probes)
    far = plan.next_range()
    assert far is probes[0] and far.end is None  # sent first
    (last_piece,) = [p for p in probes if p.end == far.start]
    for r in [root, *plan.probes]:
        r.in_flight = True
    # The far probe finds names where the first page's density said: the range
    # below it is cut into pieces of a page each before its own page returns.
    at = next(i for i, n in enumerate(names) if n >= far.start)
    plan.answered(far, True)
    plan.take(far, [ObjectInfo(n, 1) for n in names[at : at + 415]])
    far.done = True
    assert plan.top_hits == 1 and plan.searches == 0
    plan.plan()
    assert last_piece.filled and last_piece.first is None
    assert len(plan.fills) > 32


@pytest.mark.parametrize(("count", "page_size"), [(20_000, 200), (100_000, 1000), (130_000, 1000)])
def test_the_end_of_counted_names_is_found_in_few_rounds(
    bucket: MemoryStore, count: int, page_size: int
) -> None:
    # Searches past counted names place their probes a constant factor apart
    # in position from the start of the key space: the end is bracketed within
    # a round or two, and the last pages do not trail behind. Once bracketed
    # within 16 pages, the range is cut into pieces of a page, each listed in
    # that round (130k: 6 rounds when searched on). A range whose page is in
    # flight gets its first piece where that page ends, not a piece further
    # (100k: 6 rounds when it listed that piece itself, a round later).
    names = [f"img/{i:06d}.jpg" for i in range(count)]
    seed(bucket, names)
    counting = RoundCountingStore(bucket, latency=0.01)
    assert names_of(listing(counting, "img/", replace(QUIET, objects_per_page=page_size))) == names
    assert max(counting.rounds) <= 5, sorted(collections.Counter(counting.rounds).items())
    assert counting.calls <= 1.3 * (len(names) // page_size + 1)


def test_names_counted_up_are_told_from_spread_ones() -> None:
    assert counted_up([f"img/{i:06d}.jpg" for i in range(990, 1990)])  # carries included
    assert counted_up([f"log-{1_700_000_000_000 + 37 * i}" for i in range(1000)])  # with gaps
    assert not counted_up(sorted(f"img/{_hashed(i)}.jpg" for i in range(1000)))
    rng = random.Random(0)
    assert not counted_up(sorted(str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(1000)))
    assert not counted_up(["a", "b"])  # too few to tell


@pytest.mark.parametrize("stem", [True, False], ids=["under-a-stem", "spread"])
def test_pieces_are_guessed_past_the_first_page_of_spread_names_only(
    bucket: MemoryStore, stem: bool
) -> None:
    # Hashes spread over the key space (50 pages): the far probe and
    # AHEAD_PIECES pieces right past the first page go out together after
    # it, in the second round. Hashes under one date: the first page shares
    # "d/20240101_" beyond the prefix, and its density held over the key
    # space after "d/" makes billions of pages; pieces past it would come
    # back empty (3 + the pieces, with the guess). Without them: the first
    # page, its continuation, the far probe and one search probe.
    count = 1500 if stem else 50_000
    names = sorted(f"d/{'20240101_' if stem else ''}{_hashed(i)}" for i in range(count))
    seed(bucket, names)
    counting = RoundCountingStore(bucket, latency=0.005)
    assert names_of(listing(counting, "d/")) == names
    if stem:
        assert counting.calls <= 4
    else:
        assert collections.Counter(counting.rounds)[2] >= AHEAD_PIECES + 1
        assert counting.calls <= 1.3 * 50


def test_names_that_stop_and_resume_far_on(bucket: MemoryStore) -> None:
    # Two clusters with an empty stretch between them: a probe past the first
    # comes back empty, yet the second must be found, whole and in order.
    names = [f"k/0{i:05d}" for i in range(3000)] + [f"k/9{i:05d}" for i in range(2000)]
    seed(bucket, names)
    counting = CountingStore(bucket, latency=0.001)
    config = replace(QUIET, objects_per_page=100)
    assert names_of(listing(counting, "k/", config)) == names
    # Each end of a cluster costs an exponential search past it: a few empty
    # requests, not a page's worth per stretch of empty key space.
    assert counting.calls <= 2 * (len(names) // 100 + 1)


class FolderCountingStore(CountingStore):
    """A counting store over a store that lists folders (GCS's ``delimiter=/``)."""

    def __init__(self, inner: Any, **kw: Any) -> None:
        super().__init__(inner, **kw)
        self.folder_calls = 0

    async def list_folder(self, prefix: str, **kw: Any) -> ListPage:
        self.calls += 1
        self.folder_calls += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        page: ListPage = await self.inner.list_folder(prefix, **kw)
        return page


def _demo_layout() -> list[str]:
    classes = ["circle", "square", "triangle", "cross", "ring", "diamond"]
    return sorted(f"train/{classes[i % 6]}/{i:06d}.png" for i in range(16_667))


@pytest.mark.parametrize("folders", [False, True], ids=["key-ranges", "folders"])
def test_an_image_folder_costs_few_requests(bucket: MemoryStore, folders: bool) -> None:
    # The demo's layout: six folders of about three pages each, with the key
    # space between folders empty. Without folder listings, probes between
    # folders come back empty and the lister must learn that rather than pay
    # for it per folder (it made 82 requests here before it counted them);
    # with them, each folder is listed as a prefix of its own.
    names = _demo_layout()
    seed(bucket, names)
    store_type = FolderCountingStore if folders else CountingStore
    counting = store_type(bucket, latency=0.01)
    stats = ListingStats()
    assert names_of(listing(counting, "train/", stats=stats)) == names
    sequential_pages = len(names) // 1000 + 1
    assert counting.calls <= (1.5 if folders else 2) * sequential_pages
    assert stats.ranges > 6  # still parallel: every folder listed apart


@pytest.mark.parametrize("hashed", [False, True], ids=["sequential", "hashed"])
def test_a_prefix_holding_one_folder_lists_as_the_folder_does(
    bucket: MemoryStore, hashed: bool
) -> None:
    # Names under one date (``d/2024-01-01/...`` listed from ``d/``): the
    # first page lies in the folder, which goes on where the page ends, is
    # listed on first, and is planned from that page as its own prefix would
    # be. It once waited for two more pages of its own (the rule for folders,
    # most of which end within two) and fanned out rounds later (100k
    # hashed names: round 6, not 3; counted: 11 rounds, not 6).
    names = sorted(
        f"d/2024-01-01/{_hashed(i) if hashed else f'{i:06d}'}.jpg" for i in range(20_000)
    )
    seed(bucket, names)
    config = replace(QUIET, objects_per_page=200)
    direct = RoundCountingStore(bucket, latency=0.005)
    assert names_of(listing(direct, "d/2024-01-01/", config)) == names
    parent = FolderCountingStore(bucket, latency=0.005)
    rounds = RoundCountingStore(parent)
    assert names_of(listing(rounds, "d/", config)) == names
    assert parent.folder_calls == 1
    assert max(rounds.rounds) <= max(direct.rounds), (rounds.rounds, direct.rounds)
    assert rounds.calls <= direct.calls + 2


def test_imagenet_layout_lists_folder_by_folder(bucket: MemoryStore) -> None:
    # ImageNet's layout: a folder per class, the class repeated in each name.
    # Listed as key ranges alone, these 100 pages once cost 1,276 requests.
    names = [f"imgs/n{c:08d}/n{c:08d}_{j}.JPEG" for c in range(100) for j in range(1000)]
    names += ["imgs/README", "imgs/n00000050.txt", "imgs/zz"]  # names between the folders too
    seed(bucket, names)
    counting = FolderCountingStore(bucket)
    stats = ListingStats()
    assert names_of(listing(counting, "imgs/", stats=stats)) == sorted(names)
    assert counting.folder_calls == 1
    assert counting.calls == stats.requests <= 1.3 * (len(names) // 1000 + 1)


def test_more_folders_than_a_page_are_listed_as_one_key_space(bucket: MemoryStore) -> None:
    names = sorted(f"f/{c:03d}/{j:03d}" for c in range(12) for j in range(20))
    seed(bucket, names)
    counting = FolderCountingStore(bucket)
    config = replace(QUIET, objects_per_page=10)  # 12 folders: more than a page
    assert names_of(listing(counting, "f/", config)) == names
    assert counting.folder_calls == 1


def test_small_folders_are_not_listed_one_by_one(bucket: MemoryStore) -> None:
    names = sorted(f"t/{c:04d}/{j}.bin" for c in range(3000) for j in range(3))
    seed(bucket, names)
    counting = FolderCountingStore(bucket)
    assert names_of(listing(counting, "t/")) == names
    assert counting.folder_calls == 0  # three names a folder: not worth a request each
    assert counting.calls <= 2 * (len(names) // 1000 + 1)


def test_a_failing_folder_listing_fails_the_listing(bucket: MemoryStore) -> None:
    seed(bucket, _demo_layout())
    counting = FolderCountingStore(bucket, fail_call=2)  # the folder listing
    with pytest.raises(TransientError, match="listing failed after 1000 objects"):
        listing(counting, "train/")


def test_a_prefix_of_a_few_pages_costs_a_few_requests(bucket: MemoryStore) -> None:
    names = [f"p/{i:04d}" for i in range(35)]
    seed(bucket, names)
    counting = CountingStore(bucket, latency=0.001)
    assert names_of(listing(counting, "p/", replace(QUIET, objects_per_page=10))) == names
    # Four pages: a probe or two past the names come back empty, no more.
    assert counting.calls <= 10


def test_short_pages_from_the_store(bucket: MemoryStore) -> None:
    names = [f"s/{i:05d}" for i in range(500)]
    seed(bucket, names)
    counting = CountingStore(bucket, max_page=7)
    assert names_of(listing(counting, "s/", replace(QUIET, objects_per_page=50))) == names


# -- names of any shape ---------------------------------------------------------


def test_one_character_alphabet(bucket: MemoryStore) -> None:
    names = ["a" * k for k in range(1, 400)]
    seed(bucket, names)
    assert names_of(listing(bucket, "a", replace(QUIET, objects_per_page=7))) == names


def test_multibyte_utf8_names(bucket: MemoryStore) -> None:
    names = [f"数据/{c}{i}" for c in ("a", "é", "中", "\U0001f600", "~") for i in range(40)]
    seed(bucket, names)
    got = names_of(listing(bucket, "数据/", replace(QUIET, objects_per_page=9)))
    assert got == sorted(names, key=lambda n: n.encode("utf-8"))


def test_names_that_are_prefixes_of_others(bucket: MemoryStore) -> None:
    names = ["k", "k/", "k/a", "k/a/", "k/a/b", "k0", "ka", "kab", "kabc"]
    seed(bucket, names)
    config = replace(QUIET, objects_per_page=2, include_folders=True)
    assert names_of(listing(bucket, "k", config)) == sorted(names)


def test_characters_below_zero_and_above_z_and_long_shared_prefixes(bucket: MemoryStore) -> None:
    stem = "deep/" + "x" * 300 + "/"
    names = [stem + c * k for c in "!#%+-.{|}~" for k in range(1, 25)]
    seed(bucket, names)
    assert names_of(listing(bucket, stem, replace(QUIET, objects_per_page=8))) == sorted(names)


# -- what is left out -----------------------------------------------------------


def test_hidden_objects_and_folders_are_excluded(bucket: MemoryStore) -> None:
    visible = ["d/a.jpg", "d/sub/b.jpg"]
    hidden = ["d/", "d/sub/", "d/.c.bin.tbupload-123/part-00001", "d/.e.tbtmp-9"]
    seed(bucket, visible + hidden + ["dataflux-composed-objects/d/1"])
    assert names_of(listing(bucket, "d/")) == visible
    assert names_of(
        listing(bucket, "", replace(QUIET, include_hidden=True, include_folders=True))
    ) == sorted(visible + hidden + ["dataflux-composed-objects/d/1"])


def test_every_storage_class_unless_filtered(bucket: MemoryStore) -> None:
    names = ["c/archive", "c/cold", "c/hot", "c/near"]
    seed(bucket, names)
    classes = {
        "c/archive": "ARCHIVE",
        "c/cold": "COLDLINE",
        "c/hot": "STANDARD",
        "c/near": "NEARLINE",
    }
    counting = CountingStore(bucket, classes=classes)
    assert names_of(listing(counting, "c/")) == names
    only = replace(QUIET, storage_classes={"nearline", "STANDARD"})  # type: ignore[arg-type]
    assert names_of(listing(counting, "c/", only)) == ["c/hot", "c/near"]


# -- failures -------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        DeadlineExceededError("gave up after 5 attempts", operation="list", uri="memory://x/p"),
        PermissionDeniedError("no", operation="list", uri="memory://x/p", status=403),
    ],
)
def test_a_failing_page_fails_the_listing_cleanly(bucket: MemoryStore, error: StorageError) -> None:
    seed(bucket, [f"f/{i:05d}" for i in range(3000)])
    counting = CountingStore(bucket, fail_call=4, error=error, latency=0.002)
    with pytest.raises(type(error)) as caught:
        listing(counting, "f/", replace(QUIET, objects_per_page=100))
    assert caught.value.uri == bucket.uri("f/")
    assert "listing failed" in str(caught.value) and bucket.uri("f/") in str(caught.value)
    assert caught.value.__cause__ is not None
    # The other listers were cancelled: no request is made after the failure.
    calls = counting.calls
    runtime.run(asyncio.sleep(0.05))
    assert counting.calls == calls


def test_a_failing_first_page_fails_too(bucket: MemoryStore) -> None:
    counting = CountingStore(bucket, fail_call=1)
    with pytest.raises(TransientError, match="listing failed after 0 objects"):
        listing(counting, "p/")


# -- determinism, properties -----------------------------------------------------


def test_parallel_and_sequential_listings_agree(bucket: MemoryStore) -> None:
    import hashlib

    names = [f"h/{hashlib.sha1(str(i).encode()).hexdigest()[:12]}" for i in range(5000)]
    seed(bucket, names)
    config = replace(QUIET, objects_per_page=50)
    parallel = listing(bucket, "h/", config)
    assert parallel == listing(bucket, "h/", replace(config, pages_in_flight=1))
    assert parallel == listing(bucket, "h/", config)
    assert names_of(parallel) == sorted(names)


_ALPHABET = st.sampled_from([*"ab/0z.~", "é", "中"])


_SEGMENT = st.text(st.sampled_from([*"ab0.~", "é"]), min_size=1, max_size=3)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    folders=st.dictionaries(_SEGMENT, st.integers(0, 40), max_size=6),
    # Few loose names and pages of a few entries: the folders then often fit
    # on one page of the folder listing, which is when the lister splits.
    loose=st.sets(_SEGMENT, max_size=3),
    page_size=st.integers(2, 12),
    parallelism=st.integers(1, 8),
)
def test_property_folder_listing_equals_sequential(
    folders: dict[str, int], loose: set[str], page_size: int, parallelism: int
) -> None:
    # Folders of any size with names directly under the prefix between them
    # (``p/a.x`` sorts between ``p/a/...`` and ``p/a0/...``'s neighbours).
    names = {f"p/{f}/{i:02d}" for f, n in folders.items() for i in range(n)}
    names |= {f"p/{n}" for n in loose}
    with memory_bucket("prop", ((n, b"x") for n in names)) as bucket_name:
        store = MemoryStore(bucket_name)
        config = ListingConfig(
            progress=False, objects_per_page=page_size, pages_in_flight=parallelism
        )
        assert names_of(listing(FolderCountingStore(store), "p/", config)) == sorted(names)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    names=st.sets(st.text(_ALPHABET, min_size=0, max_size=6), max_size=250),
    prefix=st.sampled_from(["", "a", "b/", "中"]),
    page_size=st.integers(1, 7),
    parallelism=st.integers(1, 8),
)
def test_property_parallel_equals_sequential(
    names: set[str], prefix: str, page_size: int, parallelism: int
) -> None:
    with memory_bucket("prop", ((prefix + n, b"x") for n in names)) as bucket_name:
        expected = sorted(prefix + n for n in names if not (prefix + n).endswith("/"))
        config = ListingConfig(
            progress=False, objects_per_page=page_size, pages_in_flight=parallelism
        )
        assert names_of(listing(MemoryStore(bucket_name), prefix, config)) == expected


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    # Names counted up, in runs with gaps between them: the shape whose end
    # is searched for, then cut into pieces of a page once bracketed.
    runs=st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 400)), min_size=1, max_size=4),
    page_size=st.integers(2, 40),
    parallelism=st.integers(1, 16),
)
def test_property_counted_names_list_whole(
    runs: list[tuple[int, int]], page_size: int, parallelism: int
) -> None:
    names, at = set(), 0
    for gap, count in runs:
        at += gap
        names |= {f"img/{i:06d}.jpg" for i in range(at, at + count)}
        at += count
    with memory_bucket("prop", ((n, b"x") for n in names)) as bucket_name:
        config = ListingConfig(
            progress=False, objects_per_page=page_size, pages_in_flight=parallelism
        )
        assert names_of(listing(MemoryStore(bucket_name), "img/", config)) == sorted(names)


# -- progress -------------------------------------------------------------------


def test_progress_bar_when_asked(bucket: MemoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    seed(bucket, [f"b/{i}" for i in range(30)])
    listing(bucket, "b/", replace(QUIET, objects_per_page=10), progress=True)
    err = capsys.readouterr().err
    assert "listing memory://" in err and "30" in err


def test_no_progress_bar_when_not_interactive(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(bucket, [f"b/{i}" for i in range(30)])
    listing(bucket, "b/", ListingConfig())  # "auto", and stderr is captured: not a TTY
    assert capsys.readouterr().err == ""


def test_progress_into_the_callers_bar(bucket: MemoryStore) -> None:
    seed(bucket, [f"b/{i:02d}" for i in range(25)])

    class Bar:
        total = 0

        def update(self, n: int) -> None:
            self.total += n

    bar = Bar()
    listing(bucket, "b/", replace(QUIET, objects_per_page=4), progress=bar)
    assert bar.total == 25


# -- the cache --------------------------------------------------------------------


def test_cache_skips_the_listing_of_a_restarted_job(bucket: MemoryStore, tmp_path: Any) -> None:
    seed(bucket, [f"c/{i:03d}" for i in range(120)])
    config = replace(QUIET, objects_per_page=10, cache=str(tmp_path / "m" / "listing.json.gz"))
    first = listing(bucket, "c/", config)
    broken = CountingStore(bucket, fail_call=1)  # any list request would fail
    assert listing(broken, "c/", config) == first
    assert broken.calls == 0
    # Another prefix, other filters, or too old: listed again (and rewritten).
    assert listing(bucket, "c/00", config) == first[:10]
    assert listing(bucket, "c/", config) == first
    assert listing(CountingStore(bucket), "c/", replace(config, include_folders=True)) == first
    with pytest.raises(TransientError):
        listing(broken, "c/", replace(config, cache_max_age=0.0))


def test_cache_in_the_bucket_is_not_listed_itself(bucket: MemoryStore) -> None:
    seed(bucket, ["c/a", "c/b"])
    config = replace(QUIET, cache=bucket.uri("c/_listing.json.gz"))
    assert names_of(listing(bucket, "c/", config)) == ["c/a", "c/b"]
    assert runtime.run(bucket.head("c/_listing.json.gz")).size > 0
    broken = CountingStore(bucket, fail_call=1)
    assert names_of(listing(broken, "c/", config)) == ["c/a", "c/b"]


def _cache_bytes(bucket: MemoryStore, config: ListingConfig, objects: list[ObjectInfo]) -> bytes:
    """A manifest of ``objects`` as the listing of ``c/`` (a writer may put anything there)."""
    location = ManifestLocation(str(config.cache), bucket)
    runtime.run(location.write(bucket.uri("c/"), config._filters(), objects))
    with open(str(config.cache), "rb") as f:
        return f.read()


@pytest.mark.parametrize("damage", ["not gzip", "truncated", "corrupt"])
def test_unreadable_cache_is_ignored(bucket: MemoryStore, tmp_path: Any, damage: str) -> None:
    seed(bucket, ["c/a"])
    path = tmp_path / "listing.json.gz"
    config = replace(QUIET, cache=str(path))
    data = _cache_bytes(bucket, config, [ObjectInfo(f"c/{i}", i, i) for i in range(500)])
    if damage == "not gzip":
        data = b"not gzip"
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # a gzip header before deflate data that is not
        data = data[:10] + bytes([0xFF]) * 64 + data[-8:]
    path.write_bytes(data)
    assert names_of(listing(bucket, "c/", config)) == ["c/a"]


def test_a_cache_that_decompresses_past_the_cap_is_not_inflated(
    bucket: MemoryStore, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from torchbucket.listing import _manifest

    cap = 64 * 1024
    monkeypatch.setattr(_manifest, "_MAX_BYTES", cap, raising=False)
    seed(bucket, ["c/a"])
    config = replace(QUIET, cache=str(tmp_path / "listing.json.gz"))
    bomb = _cache_bytes(bucket, config, [ObjectInfo("c/a", 0, 1)] * 100_000)
    assert len(bomb) < cap  # small to read; far larger inflated
    assert names_of(listing(bucket, "c/", config)) == ["c/a"]
    assert any(f"more than {cap} bytes" in r.getMessage() for r in caplog.records)


# -- entry points and configuration ------------------------------------------------


def test_list_objects_from_sync_code(bucket: MemoryStore) -> None:
    seed(bucket, ["s/1", "s/2"])
    assert names_of(list_objects(bucket.uri("s/"), config=QUIET)) == ["s/1", "s/2"]


def test_local_store(tmp_path: Any) -> None:
    from torchbucket.storage.local import LocalStore

    root = tmp_path / "ds"
    names = [f"{d}/{i:03d}.bin" for d in ("a", "b", "c é") for i in range(40)]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"123")
    (root / "a" / "empty").mkdir()
    store = LocalStore()
    prefix = str(root).lstrip("/") + "/"
    objects = listing(store, prefix, replace(QUIET, objects_per_page=16))
    assert [o.name[len(prefix) :] for o in objects] == sorted(names)
    assert {o.size for o in objects} == {3}
    assert names_of(list_objects(f"file://{root}/b/", config=QUIET)) == [
        prefix + n for n in sorted(names) if n.startswith("b/")
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pages_in_flight": 0},
        {"objects_per_page": 0},
        {"objects_per_page": 1001},
        {"storage_classes": "STANDARD"},
        {"storage_classes": set()},
        {"progress": "yes"},
        {"broadcast": None},
        {"cache_max_age": -1.0},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ListingConfig(**kwargs)


def test_config_defaults() -> None:
    config = ListingConfig()
    assert config.pages_in_flight == 64 and config.objects_per_page == 1000
    assert config.storage_classes is None and config.progress == "auto"
    assert not config.include_hidden and config.cache is None


def test_progress_does_not_break_on_a_stream_without_isatty(
    monkeypatch: pytest.MonkeyPatch, bucket: MemoryStore
) -> None:
    import sys

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    seed(bucket, ["x/1"])
    assert names_of(listing(bucket, "x/", ListingConfig())) == ["x/1"]
    assert sys.stderr.getvalue() == ""


def test_an_empty_first_page_that_says_there_is_more(bucket: MemoryStore) -> None:
    # GCS may answer a page with no items and a token (deleted objects): go on.
    seed(bucket, [f"e/{i}" for i in range(5)])

    class EmptyFirst(CountingStore):
        async def list_page(self, prefix: str = "", **kw: Any) -> ListPage:
            if self.calls == 0:
                self.calls += 1
                return ListPage([], "e/")
            return await super().list_page(prefix, **kw)

    store = EmptyFirst(bucket)
    assert names_of(listing(store, "e/")) == [f"e/{i}" for i in range(5)]
    assert store.calls == 2


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_left_as_it_was(bucket: MemoryStore, enabled: bool) -> None:
    # A parallel listing pauses the collector while it builds its objects; it
    # must be back as the caller had it afterwards, failed listing or not.
    import gc

    seed(bucket, [f"g/{i:04d}" for i in range(300)])
    config = replace(QUIET, objects_per_page=10)
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        assert len(listing(bucket, "g/", config)) == 300
        assert gc.isenabled() is enabled
        failing = CountingStore(
            bucket,
            fail_call=3,
            error=PermissionDeniedError("no", operation="list", uri="memory://x/g/"),
        )
        with pytest.raises(PermissionDeniedError):
            listing(failing, "g/", config)
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()
