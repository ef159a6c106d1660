"""The parallel listing over HTTP: the model store, faults, and fake-gcs-server."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.emulator import Emulator, LatencyModel
from torchbucket.errors import DeadlineExceededError, PermissionDeniedError
from torchbucket.listing import ListingConfig, ListingStats, alist_objects, list_objects

pytestmark = pytest.mark.emulator

QUIET = ListingConfig(progress=False)

# Every shape of name the listing must get right, under one prefix.
ODD_NAMES = [
    "d/a",
    "d/a/",  # folder placeholder: left out
    "d/a/b",
    "d/aa",
    "d/aaa",
    "d/ab",
    "d/!bang",
    "d/~tilde",
    "d/é",
    "d/中文/1",
    "d/\U0001f600",
    "d/x" * 3 + "/" + "y" * 200,
]


def _hashed(n: int) -> list[str]:
    return [f"h/{hashlib.blake2b(str(i).encode(), digest_size=6).hexdigest()}" for i in range(n)]


def test_parallel_listing_over_http(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator)
    names = _hashed(2500) + [f"s/{i:05d}.jpg" for i in range(2500)] + ODD_NAMES
    names += ["dataflux-composed-objects/h/1", "h/"]
    emulator.seed(store.bucket, {n: b"ab" for n in names})
    config = ListingConfig(progress=False, objects_per_page=100)
    for prefix in ("h/", "s/", "d/"):
        emulator.reset_stats()
        stats = ListingStats()
        objects = runtime.run(alist_objects(store, prefix, config=config, stats=stats))
        expected = sorted(
            (n for n in names if n.startswith(prefix) and not n.endswith("/")),
            key=lambda n: n.encode(),
        )
        assert [o.name for o in objects] == expected
        assert all(o.size == 2 and o.generation and o.crc32c for o in objects)
        assert emulator.stats()["by_op"]["list"] == stats.requests
    # The whole bucket: hidden composites and folders left out.
    everything = runtime.run(alist_objects(store, "", config=config))
    assert len(everything) == len(names) - 3


def test_listed_in_parallel_at_a_sequential_cost(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    # At the scale the issue sets (100k objects, 1,000 a page), over HTTP, with
    # a cloud-like page latency (the listers' pace depends on it).
    store = gcs_bucket_factory(emulator)
    emulator.seed(store.bucket, ((f"p/{i:06d}.jpg", b"") for i in range(100_000)))
    emulator.set_latency(LatencyModel(list_page=0.03, bandwidth=None))
    emulator.reset_stats()
    stats = ListingStats()
    objects = runtime.run(alist_objects(store, "p/", config=QUIET, stats=stats))
    assert len(objects) == 100_000
    assert stats.ranges > 1
    assert emulator.stats()["by_op"]["list"] <= 1.3 * (100_000 // 1000 + 1)


def test_transient_page_failures_are_retried(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator)
    emulator.seed(store.bucket, {f"r/{i:04d}": b"" for i in range(1500)})
    emulator.add_fault("list", "503", nth=3, count=2)
    emulator.add_fault("list", "reset", nth=6)
    config = ListingConfig(progress=False, objects_per_page=100)
    objects = runtime.run(alist_objects(store, "r/", config=config))
    assert [o.name for o in objects] == [f"r/{i:04d}" for i in range(1500)]


def test_a_page_that_keeps_failing_fails_the_listing(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    retry = RetryConfig(initial_backoff=0.01, max_backoff=0.02, deadline=5.0, max_attempts=3)
    store = gcs_bucket_factory(emulator, retry=retry)
    emulator.seed(store.bucket, {f"f/{i:04d}": b"" for i in range(1500)})
    emulator.add_fault("list", "503", nth=4, count=None)
    with pytest.raises(DeadlineExceededError) as caught:
        runtime.run(
            alist_objects(store, "f/", config=ListingConfig(progress=False, objects_per_page=100))
        )
    assert caught.value.uri == f"gs://{store.bucket}/f/"
    assert f"gs://{store.bucket}/f/" in str(caught.value)


def test_permission_denied_names_the_prefix(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(emulator)
    emulator.add_fault("list", "403")
    with pytest.raises(PermissionDeniedError, match=f"gs://{store.bucket}/x/"):
        runtime.run(alist_objects(store, "x/", config=QUIET))


def test_list_objects_with_a_gcs_uri(emulator: Emulator, bucket_name: str) -> None:
    from torchbucket.storage.gcs import GCSConfig

    emulator.create_bucket(bucket_name)
    emulator.seed(bucket_name, {"t/1": b"", "t/2": b"", "u/3": b""})
    config = GCSConfig(endpoint=emulator.endpoint, anonymous=True)
    objects = list_objects(f"gs://{bucket_name}/t/", config=QUIET, gcs=config)
    assert [o.name for o in objects] == ["t/1", "t/2"]


def test_cache_in_the_bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> None:
    # No hedged reads: the manifest must be one GET (a slow one would be hedged).
    store = gcs_bucket_factory(emulator, hedge=HedgeConfig(enabled=False))
    emulator.seed(store.bucket, {f"c/{i:03d}": b"" for i in range(250)})
    manifest = f"gs://{store.bucket}/c/_listing.json.gz"
    config = ListingConfig(progress=False, objects_per_page=50, cache=manifest)
    first = runtime.run(alist_objects(store, "c/", config=config))
    assert len(first) == 250
    emulator.reset_stats()
    assert runtime.run(alist_objects(store, "c/", config=config)) == first
    stats = emulator.stats()
    assert stats["by_op"].get("list", 0) == 0 and stats["by_op"].get("get", 0) == 1


def test_fake_gcs_server_agrees(fake_gcs: Emulator, gcs_bucket_factory: Callable[..., Any]) -> None:
    # The fidelity reference: offsets, tokens and UTF-8 order as the real thing.
    store = gcs_bucket_factory(fake_gcs)
    names = _hashed(300) + [n.replace("d/", "h/", 1) for n in ODD_NAMES if not n.endswith("/")]
    fake_gcs.seed(store.bucket, {n: b"z" for n in names})
    objects = runtime.run(
        alist_objects(store, "h/", config=ListingConfig(progress=False, objects_per_page=20))
    )
    assert [o.name for o in objects] == sorted(names, key=lambda n: n.encode())


def _folders(count: int, per_folder: int) -> list[str]:
    names = [f"i/n{c:04d}/n{c:04d}_{j}.jpg" for c in range(count) for j in range(per_folder)]
    return [*names, "i/README", "i/n0001.txt", "i/zz"]  # names between the folders too


def test_folders_listed_folder_by_folder_over_http(
    emulator: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    # An image folder: GCS's delimiter=/ listing names the folders, and each
    # is listed as a prefix of its own, in about one request per page.
    store = gcs_bucket_factory(emulator)
    names = _folders(12, 150)
    emulator.seed(store.bucket, {n: b"ab" for n in names})
    emulator.reset_stats()
    stats = ListingStats()
    config = ListingConfig(progress=False, objects_per_page=100)
    objects = runtime.run(alist_objects(store, "i/", config=config, stats=stats))
    assert [o.name for o in objects] == sorted(names)
    assert all(o.size == 2 and o.generation for o in objects)
    assert emulator.stats()["by_op"]["list"] == stats.requests
    assert stats.requests <= 2 * 12 + 2  # two pages a folder, the first page and the folders


def test_fake_gcs_server_agrees_on_folders(
    fake_gcs: Emulator, gcs_bucket_factory: Callable[..., Any]
) -> None:
    store = gcs_bucket_factory(fake_gcs)
    names = _folders(5, 60)
    fake_gcs.seed(store.bucket, {n: b"z" for n in names})
    stats = ListingStats()
    config = ListingConfig(progress=False, objects_per_page=40)
    objects = runtime.run(alist_objects(store, "i/", config=config, stats=stats))
    assert [o.name for o in objects] == sorted(names)
    assert stats.requests <= 2 * 5 + 2
