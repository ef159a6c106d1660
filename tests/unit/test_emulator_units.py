"""Pure parts of the emulator: fault rules, ranges, routes, masks, seeding, listing."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbucket.emulator._faults import FaultRule, FaultTable
from torchbucket.emulator._fields import parse_fields
from torchbucket.emulator._http import ApiError, parse_range
from torchbucket.emulator._latency import LatencyModel, RateCap, resolve_latency
from torchbucket.emulator._model_store import ModelStore, Preconditions
from torchbucket.emulator._pieces import Pieces, checksums
from torchbucket.emulator._routes import parse_route
from torchbucket.emulator._seed import decode_frames, encode_frames, generated_names
from torchbucket.errors import ConfigError


@given(
    nth=st.integers(1, 6),
    count=st.one_of(st.none(), st.integers(1, 6)),
    total=st.integers(0, 15),
)
def test_a_rule_fires_on_requests_nth_to_nth_plus_count(
    nth: int, count: int | None, total: int
) -> None:
    table = FaultTable()
    table.add(FaultRule(op="get", kind="503", nth=nth, count=count))
    fired = [i for i in range(1, total + 1) if table.check("get", "x") is not None]
    last = total if count is None else min(total, nth + count - 1)
    assert fired == list(range(nth, last + 1))


def test_rules_count_only_matching_requests() -> None:
    table = FaultTable()
    table.add(FaultRule(op="get", kind="reset", nth=2, match="shard-"))
    assert table.check("put", "shard-1") is None  # other op
    assert table.check("get", "index") is None  # no match
    assert table.check("get", "shard-1") is None  # first match
    rule = table.check("get", "shard-2")
    assert rule is not None and rule.kind == "reset"
    assert table.check("get", "shard-3") is None


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-4", 10, (0, 4)),
        ("bytes=5-", 10, (5, 9)),
        ("bytes=-3", 10, (7, 9)),
        ("bytes=8-100", 10, (8, 9)),
        ("bytes=-30", 10, (0, 9)),
    ],
)
def test_parse_range(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == expected


def test_unsatisfiable_range_is_416() -> None:
    with pytest.raises(ApiError) as info:
        parse_range("bytes=10-", 10)
    assert info.value.status == 416


@pytest.mark.parametrize(
    ("method", "path", "query", "op", "kind", "bucket", "name"),
    [
        ("GET", "/storage/v1/b/bk/o", {}, "list", "list", "bk", ""),
        ("GET", "/storage/v1/b/bk/o/a%2Fb%20c", {"alt": "media"}, "get", "media", "bk", "a/b c"),
        ("GET", "/download/storage/v1/b/bk/o/a", {"alt": "media"}, "get", "media", "bk", "a"),
        ("GET", "/storage/v1/b/bk/o/a%2Fb", {}, "head", "metadata", "bk", "a/b"),
        ("POST", "/storage/v1/b/bk/o/d%2Fe/compose", {}, "compose", "compose", "bk", "d/e"),
        ("DELETE", "/storage/v1/b/bk/o/x", {}, "delete", "delete", "bk", "x"),
        (
            "POST",
            "/upload/storage/v1/b/bk/o",
            {"uploadType": "resumable"},
            "resumable",
            "resumable_start",
            "bk",
            "",
        ),
        (
            "PUT",
            "/upload/storage/v1/b/bk/o",
            {"upload_id": "u"},
            "resumable",
            "resumable_chunk",
            "bk",
            "",
        ),
        ("GET", "/storage/v1/b/bk/iam/testPermissions", {}, "iam", "iam", "bk", ""),
        (
            "POST",
            "/bk/a/b?uploads",
            {"uploads": ""},
            "mpu_initiate",
            "mpu_initiate",
            "bk",
            "a/b?uploads",
        ),
        ("PUT", "/bk/k", {"partNumber": "1", "uploadId": "u"}, "mpu_part", "mpu_part", "bk", "k"),
        ("GET", "/bk", {"uploads": ""}, "mpu_list", "mpu_list", "bk", ""),
        ("GET", "/bk/dir/k", {}, "get", "xml_get", "bk", "dir/k"),
    ],
)
def test_parse_route(
    method: str, path: str, query: dict[str, str], op: str, kind: str, bucket: str, name: str
) -> None:
    # The route parser sees the path without its query string.
    route = parse_route(method, path.partition("?")[0], query)
    assert (route.op, route.kind, route.bucket) == (op, kind, bucket)
    assert route.name == name.partition("?")[0]


def test_copy_and_rewrite_routes_carry_both_objects() -> None:
    route = parse_route("POST", "/storage/v1/b/s/o/a%2Fb/rewriteTo/b/d/o/c%2Fd", {})
    assert (route.op, route.kind, route.bucket, route.name, route.bucket2, route.name2) == (
        "copy",
        "rewrite",
        "s",
        "a/b",
        "d",
        "c/d",
    )


def test_fields_masks() -> None:
    mask = parse_fields("items(name,size,generation),nextPageToken")
    assert mask.wants("items") and mask.wants("nextPageToken") and not mask.wants("prefixes")
    assert mask.items == ("name", "size", "generation")
    assert parse_fields("items/name,prefixes").items == ("name",)
    assert parse_fields(None).items is None
    assert parse_fields("name,size", collection=False).items == ("name", "size")


@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=20))
def test_seed_framing_round_trips(objects: list[tuple[str, bytes]]) -> None:
    assert list(decode_frames(encode_frames(objects))) == objects


def test_truncated_seed_framing_is_refused() -> None:
    with pytest.raises(ConfigError):
        list(decode_frames(encode_frames([("a", b"xyz")])[:-1]))


def test_generated_names_are_unique() -> None:
    assert generated_names("p/", 3) == ["p/00000000", "p/00000001", "p/00000002"]
    hashed = generated_names("p/", 1000, "hashed", seed=1)
    assert len(set(hashed)) == 1000 and all(n.startswith("p/") for n in hashed)


_NAMES = st.lists(st.text(alphabet="ab/c", min_size=1, max_size=5), max_size=40, unique=True)


@settings(max_examples=60, deadline=None)
@given(
    names=_NAMES,
    prefix=st.text(alphabet="ab/", max_size=2),
    start=st.text(alphabet="abc/", max_size=3),
    end=st.text(alphabet="abc/", max_size=3),
    page=st.integers(1, 7),
)
def test_model_listing_pages_match_a_filtered_sort(
    names: list[str], prefix: str, start: str, end: str, page: int
) -> None:
    store = ModelStore()
    store.create_bucket("b")
    half = len(names) // 2
    store.seed("b", [(n, b"") for n in names[:half]])
    for n in names[half:]:
        store.put("b", n, b"")
    expected = sorted(
        n for n in names if n.startswith(prefix) and n >= start and (not end or n < end)
    )
    listed: list[str] = []
    token = ""
    while True:
        items, _, token_or_none = store.list_page(
            "b",
            prefix=prefix,
            start_offset=start,
            end_offset=end,
            page_token=token,
            max_results=page,
        )
        assert len(items) <= page
        listed.extend(o.name for o in items)
        if token_or_none is None:
            break
        token = token_or_none
    assert listed == expected


def test_model_listing_with_a_delimiter() -> None:
    store = ModelStore()
    store.create_bucket("b")
    store.seed("b", [(n, b"") for n in ["a/1", "a/2", "b/x/1", "c", "d/"]])
    items, prefixes, token = store.list_page("b", delimiter="/")
    assert [o.name for o in items] == ["c"]
    assert prefixes == ["a/", "b/", "d/"]
    assert token is None


def test_model_store_preconditions_and_generations() -> None:
    store = ModelStore()
    store.create_bucket("b")
    first = store.put("b", "k", b"1", pre=Preconditions(if_generation_match=0))
    with pytest.raises(ApiError) as info:
        store.put("b", "k", b"2", pre=Preconditions(if_generation_match=0))
    assert info.value.status == 412
    second = store.put("b", "k", b"2", pre=Preconditions(if_generation_match=first.generation))
    assert second.generation > first.generation
    with pytest.raises(ApiError):
        store.get("b", "k", generation=first.generation)


def test_compose_limits() -> None:
    store = ModelStore()
    store.create_bucket("b")
    store.seed("b", [(f"p{i}", b"x") for i in range(33)])
    sources = [{"name": f"p{i}"} for i in range(33)]
    with pytest.raises(ApiError) as info:
        store.compose("b", "out", sources, None, Preconditions())
    assert info.value.status == 400
    out = store.compose("b", "out", sources[:32], None, Preconditions())
    assert out.data == b"x" * 32 and out.component_count == 32 and out.md5 is None


def test_latency_model_and_presets() -> None:
    model = LatencyModel(read=0.02, list_page=0.06, write=0.04, bandwidth=1e6)
    assert model.delay("get", 0, 1_000_000) == pytest.approx(1.02)
    assert model.delay("list", 0, 0) == pytest.approx(0.06)
    assert model.delay("put", 500_000, 0) == pytest.approx(0.54)
    assert resolve_latency("same-region") == LatencyModel()
    assert resolve_latency(None) is None
    with pytest.raises(ConfigError):
        resolve_latency("moon")
    with pytest.raises(ConfigError):
        LatencyModel(read=-1)


def test_rate_cap_refuses_beyond_its_burst() -> None:
    cap = RateCap(5)
    results = [cap.take() for _ in range(20)]
    assert results[:5] == [0.0] * 5  # a burst of one second's worth
    assert any(wait > 0 for wait in results[5:])


def test_a_fields_mask_selects_a_subset_of_the_full_resource() -> None:
    import json

    store = ModelStore()
    store.create_bucket("b")
    plain = store.put("b", 'dir/"quoted" é', b"data", metadata={"k": "v"})
    composite = store.compose("b", "c", [{"name": plain.name}], None, Preconditions())
    for obj in (plain, composite):
        full = json.loads(obj.resource())
        for fields in [("name", "size", "generation", "crc32c"), tuple(full), ("md5Hash", "nope")]:
            partial = json.loads(obj.resource(fields))
            assert partial == {k: full[k] for k in fields if k in full}


@given(st.text(max_size=30))
def test_name_unquoting_matches_urllib(name: str) -> None:
    from urllib.parse import quote, unquote

    from torchbucket.emulator._routes import unquote as fast_unquote

    encoded = quote(name, safe="")
    assert fast_unquote(encoded) == unquote(encoded) == name
    assert fast_unquote(name.replace("%", "%25")) == unquote(name.replace("%", "%25"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=6),
    st.integers(-60, 260),
    st.integers(-60, 260),
)
def test_pieces_read_as_the_joined_bytes(chunks: list[bytes], start: int, stop: int) -> None:
    joined = b"".join(chunks)
    data = Pieces(chunks)
    assert len(data) == len(joined)
    assert data[start:stop] == joined[start:stop]
    assert isinstance(data[start:stop], bytes)
    assert data[start:] == joined[start:] and data[:stop] == joined[:stop]
    assert bytes(data) == joined
    assert checksums(data) == checksums(joined)


def test_pieces_refuse_a_stepped_slice() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        Pieces([b"ab", b"cd"])[::2]


def test_pieces_of_one_chunk_is_that_chunk_and_a_gzip_object_in_pieces_decodes() -> None:
    one = b"x" * 10
    assert Pieces.of([b"", one]) is one
    assert Pieces.of([]) == b""
    store = ModelStore()
    store.create_bucket("b")
    packed = gzip.compress(b"hello, pieces" * 100)
    obj = store.put("b", "o", Pieces([packed[:7], packed[7:]]), md5=False, content_encoding="gzip")
    assert isinstance(obj.data, Pieces)
    assert obj.decoded() == b"hello, pieces" * 100
    assert obj.crc32c == checksums(packed)[0]
