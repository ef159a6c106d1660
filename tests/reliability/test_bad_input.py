"""Bad input: each gets a clear torchbucket error naming what was wrong, at once.

"At once" is checked by a roomy retry deadline (60 s) under a short pytest
timeout: an error that is retried, or a hang, fails the test by timing out.
Where the product handles the input instead (a refused compose, a zero-byte
object, objects beyond part and range limits, unusual names), the test checks
the exact bytes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _workloads import Bucket, check_epoch, object_name, payload, same_state, state
from torch.utils.data import DataLoader

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.compose import ComposeConfig
from torchbucket.compose import _fetch as compose_fetch
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset
from torchbucket.emulator import Emulator
from torchbucket.errors import (
    BucketNotFoundError,
    ConfigError,
    InvalidURIError,
    NotFoundError,
    PermissionDeniedError,
    StorageError,
)
from torchbucket.storage.base import part_pieces
from torchbucket.storage.gcs import GCSConfig
from torchbucket.storage.memory import MemoryStore

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(20)]

#: A deadline far beyond the pytest timeout: retrying what should fail at once
#: shows up as a timeout.
PATIENT = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=60.0, read_timeout=30.0)


def gcs(emu: Emulator) -> GCSConfig:
    return GCSConfig(endpoint=emu.endpoint, anonymous=True, retry=PATIENT)


def op_count(emu: Emulator, op: str) -> int:
    """Requests of ``op`` the (shared) emulator has served so far."""
    return int(emu.stats()["by_op"].get(op, 0))


def raises(exc_type: type[BaseException], uri: str, fn: Callable[[], object]) -> BaseException:
    """``fn()`` raises ``exc_type`` with ``uri`` in its message."""
    with pytest.raises(exc_type) as info:
        fn()
    assert uri in str(info.value), f"{uri!r} not in {str(info.value)!r}"
    return info.value


# -- missing bucket, missing object, empty prefix, malformed URI ----------------


def test_missing_bucket(emulator: Emulator, bucket_kind: str) -> None:
    g = gcs(emulator)
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    uri = f"gs://{bucket}/d/"
    error = raises(BucketNotFoundError, uri, lambda: BucketMapDataset.from_prefix(uri, gcs=g))
    # Said once: not the cause's operation, URI and status repeated inside.
    assert str(error).count(uri) == 1
    assert str(error).count("HTTP 404") == 1
    raises(BucketNotFoundError, uri, lambda: BucketIterableDataset.from_prefix(uri, gcs=g))
    obj, ckpt_uri = f"gs://{bucket}/d/0", f"gs://{bucket}/c.pt"
    # Over the JSON API object requests cannot tell a missing bucket from a
    # missing object by status or reason (both 404 notFound): a NotFoundError
    # naming the object. With a gRPC endpoint the store first asks the
    # bucket's layout, whose 404 names the bucket.
    zonal = bucket_kind == "zonal"
    error, named = (BucketNotFoundError, f"gs://{bucket}/") if zonal else (NotFoundError, obj)
    raises(error, named, lambda: BucketMapDataset.from_objects([obj], gcs=g))
    ckpt = BucketCheckpoint(gcs=g)
    raises(error, named if zonal else ckpt_uri, lambda: ckpt.load(ckpt_uri))
    for method in ("multipart", "resumable"):
        small_parts = BucketCheckpoint(
            config=CheckpointConfig(part_size=4096, min_part_size=1024, upload_method=method),
            gcs=g,
        )
        raises(
            error,
            named if zonal else ckpt_uri,
            lambda ck=small_parts: ck.save(state(1), ckpt_uri),
        )


def test_missing_object_and_empty_prefix(model_bucket: Bucket) -> None:
    model_bucket.seed_dataset(3)
    g = gcs(model_bucket.emu)
    missing = model_bucket.uri("d/nope.bin")
    raises(NotFoundError, missing, lambda: BucketMapDataset.from_objects([missing], gcs=g))
    raises(
        NotFoundError,
        missing,
        lambda: BucketIterableDataset.from_objects(
            [model_bucket.uri(object_name(0)), missing], gcs=g
        ),
    )
    raises(NotFoundError, missing, lambda: BucketCheckpoint(gcs=g).load(missing))
    empty = model_bucket.uri("nothing-here/")
    raises(NotFoundError, empty, lambda: BucketMapDataset.from_prefix(empty, gcs=g))
    raises(NotFoundError, empty, lambda: BucketIterableDataset.from_prefix(empty, gcs=g))
    with pytest.raises(ConfigError):
        BucketMapDataset.from_objects([], gcs=g)


MALFORMED = [
    "gs://Bad_Bucket/d/",
    "gs://b/d/",  # too short for a bucket name
    "s3://bucket/d/",
    "gs:/bucket/d/",
    "gs:///d/",
    "file://relative/dir/",
    "gs://bucket/line\nbreak",
]


@pytest.mark.parametrize("uri", MALFORMED)
def test_malformed_uri(uri: str) -> None:
    for make in (
        lambda: BucketMapDataset.from_prefix(uri),
        lambda: BucketIterableDataset.from_prefix(uri),
        lambda: BucketMapDataset.from_objects([uri]),
        lambda: BucketCheckpoint().writer(uri + "c.pt"),
        lambda: BucketCheckpoint().reader(uri + "c.pt"),
    ):
        error = raises(InvalidURIError, repr(uri)[1:-1].split("\\n")[0], make)
        assert isinstance(error, ValueError)


def test_a_relative_path_is_a_local_directory_named_in_the_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on the command line, a path with no scheme is local (file://), not a bucket.
    monkeypatch.chdir(tmp_path)
    error = raises(
        NotFoundError,
        f"file://{tmp_path}/bucket/d/",
        lambda: BucketMapDataset.from_prefix("bucket/d/"),
    )
    assert isinstance(error, FileNotFoundError)


def test_a_checkpoint_uri_must_name_an_object(model_bucket: Bucket) -> None:
    ckpt = BucketCheckpoint(gcs=gcs(model_bucket.emu))
    for uri in (model_bucket.uri(""), model_bucket.uri("run/")):
        raises(InvalidURIError, uri, lambda u=uri: ckpt.writer(u))


# -- permission denied ------------------------------------------------------------


def test_permission_denied_on_read_and_list(model_bucket: Bucket) -> None:
    want = model_bucket.seed_dataset(20)
    emu = model_bucket.emu
    g = gcs(emu)
    ds = BucketIterableDataset.from_prefix(model_bucket.uri("d/"), gcs=g)
    ckpt = BucketCheckpoint(config=CheckpointConfig(range_size=64 * 1024), gcs=g)
    ckpt.save(state(1), model_bucket.uri("c.pt"))
    emu.add_fault("get", "403", count=None)
    raises(PermissionDeniedError, model_bucket.uri("d/"), lambda: list(ds))
    error = raises(
        PermissionDeniedError, model_bucket.uri("c.pt"), lambda: ckpt.load(model_bucket.uri("c.pt"))
    )
    assert isinstance(error, PermissionError)
    emu.clear_faults()
    emu.add_fault("list", "403", count=None)
    raises(
        PermissionDeniedError,
        model_bucket.uri("d/"),
        lambda: BucketMapDataset.from_prefix(model_bucket.uri("d/"), gcs=g),
    )
    emu.clear_faults()
    check_epoch(list(ds), want)  # nothing was damaged or cached by the refusals


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_permission_denied_on_compose_falls_back_with_one_warning(
    model_bucket: Bucket, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    want = model_bucket.seed_dataset(100)
    compose_fetch._warned.discard("refused")  # one warning per process: reset for this test
    model_bucket.emu.add_fault("compose", "403", count=None)
    g = gcs(model_bucket.emu)
    uri = model_bucket.uri("d/")
    composes = op_count(model_bucket.emu, "compose")
    with caplog.at_level(logging.WARNING, logger="torchbucket"):
        if kind == "map":
            ds = BucketMapDataset.from_prefix(uri, gcs=g, compose=ComposeConfig())
            got = [
                s for start in range(0, 100, 25) for s in ds.__getitems__(range(start, start + 25))
            ]
        else:
            got = list(BucketIterableDataset.from_prefix(uri, gcs=g))
    check_epoch(got, want)
    refusals = [r for r in caplog.records if "compose refused" in r.getMessage()]
    assert len(refusals) == 1
    assert model_bucket.uri() in refusals[0].getMessage()
    assert model_bucket.composites() == []
    assert op_count(model_bucket.emu, "compose") > composes  # compose was tried


# -- objects changing under the dataset ----------------------------------------------


@pytest.mark.parametrize("change", ["deleted", "rewritten-same-size", "rewritten-other-size"])
@pytest.mark.parametrize("compose", [True, False], ids=["compose", "direct"])
def test_object_changed_between_listing_and_reading(
    model_bucket: Bucket, change: str, compose: bool
) -> None:
    model_bucket.seed_dataset(40)
    ds = model_bucket.dataset(PATIENT, compose=compose)
    victim = object_name(17)
    if change == "deleted":
        store = model_bucket.store()
        runtime.run(store.delete(victim))
        runtime.run(store.close())
    else:
        new = payload(17) if change == "rewritten-same-size" else payload(17) + b"more"
        model_bucket.emu.seed(model_bucket.name, {victim: new})
    raises(NotFoundError, model_bucket.uri(victim), lambda: list(ds))
    # The map-style dataset too, by index and by batch.
    mds = BucketMapDataset.from_objects(
        [model_bucket.uri(object_name(i)) for i in range(20, 23)], gcs=gcs(model_bucket.emu)
    )
    assert mds[0] == payload(20)
    model_bucket.emu.seed(model_bucket.name, {object_name(20): b"changed"})
    raises(NotFoundError, model_bucket.uri(object_name(20)), lambda: mds[0])
    raises(NotFoundError, model_bucket.uri(object_name(20)), lambda: mds.__getitems__([0, 2]))
    assert model_bucket.composites() == []


def test_checkpoint_rewritten_during_load_is_never_mixed(
    model_bucket: Bucket, bucket_kind: str
) -> None:
    ckpt = model_bucket.checkpoint(PATIENT, range_size=16 * 1024, hedge=False)
    uri = model_bucket.uri("c.pt")
    ckpt.save(state(1), uri)
    # The third range read is refused as if the object had been replaced
    # meanwhile: the load fails naming the checkpoint, it does not mix versions.
    model_bucket.emu.add_fault("get", "404", nth=3)
    if bucket_kind == "regional":
        raises(NotFoundError, uri, lambda: ckpt.load(uri))
    else:
        # On gRPC the range is one of several on a bidi stream, which the 404
        # ends: when another range was being sent on it meanwhile, grpc reports
        # its own INTERNAL instead of the server's NOT_FOUND (retried, on a new
        # stream of the same generation: which a real replacement would have
        # deleted). Either way never a mix of two versions.
        try:
            got = ckpt.load(uri, weights_only=True)
        except NotFoundError as exc:
            assert uri in str(exc)
        else:
            assert same_state(got, state(1))
        assert sum(rule["fired"] for rule in model_bucket.emu.faults()) == 1
    assert same_state(ckpt.load(uri, weights_only=True), state(1))


# -- zero bytes, and sizes beyond part, range and composite limits --------------------


def test_zero_byte_objects(model_bucket: Bucket) -> None:
    objects = {object_name(i): (b"" if i % 3 == 0 else payload(i)) for i in range(30)}
    model_bucket.emu.seed(model_bucket.name, objects)
    for compose in (True, False):
        got = list(model_bucket.dataset(PATIENT, compose=compose))
        assert got == [objects[k] for k in sorted(objects)]
    ckpt = model_bucket.checkpoint(PATIENT)
    with ckpt.writer(model_bucket.uri("empty.pt")):
        pass
    with ckpt.reader(model_bucket.uri("empty.pt")) as f:
        assert f.read() == b""
    assert model_bucket.composites() == []


def test_dataset_objects_larger_than_the_composite_cap(model_bucket: Bucket) -> None:
    objects = {object_name(i): payload(i) * (300 if i % 7 == 0 else 1) for i in range(40)}
    model_bucket.emu.seed(model_bucket.name, objects)
    ds = BucketIterableDataset.from_prefix(
        model_bucket.uri("d/"),
        gcs=gcs(model_bucket.emu),
        compose=ComposeConfig(max_composite_object_size=2048),
    )
    composes = op_count(model_bucket.emu, "compose")
    assert list(ds) == [objects[k] for k in sorted(objects)]
    assert op_count(model_bucket.emu, "compose") > composes  # the small ones still coalesced
    assert model_bucket.composites() == []


def test_checkpoint_beyond_part_and_range_limits(model_bucket: Bucket, bucket_kind: str) -> None:
    uri = model_bucket.uri("big.pt")
    # 600 KB in 4 KiB parts (about 150) and 8 KiB ranges (about 75: on a zonal
    # bucket more than one bidi read stream carries).
    ckpt = model_bucket.checkpoint(PATIENT, part_size=4096, parts_in_flight=8, range_size=8192)
    ckpt.save(state(5), uri)
    assert same_state(ckpt.load(uri, weights_only=True), state(5))
    if bucket_kind == "zonal":
        return  # no resumable uploads: a save streams (test_zonal_fault_matrix_emulator.py)
    # A single upload beyond GCSConfig.max_simple_upload_size goes resumable.
    one_shot = BucketCheckpoint(
        config=CheckpointConfig(part_size=4 << 20, min_part_size=1024),
        gcs=GCSConfig(
            endpoint=model_bucket.emu.endpoint,
            anonymous=True,
            retry=PATIENT,
            max_simple_upload_size=64 * 1024,
            upload_chunk_size=256 * 1024,
        ),
    )
    resumable = op_count(model_bucket.emu, "resumable")
    one_shot.save(state(6), uri)
    assert same_state(one_shot.load(uri, weights_only=True), state(6))
    assert op_count(model_bucket.emu, "resumable") - resumable >= 3  # start and 2+ chunks
    assert model_bucket.incomplete_uploads() == []


@pytest.fixture
def part_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the parts the memory store receives, in the order they arrive."""
    sizes: list[int] = []
    original = MemoryStore.multipart_upload_part

    async def spy(
        self: MemoryStore, key: str, upload_id: str, number: int, data: Any, **kw: Any
    ) -> Any:
        sizes.append(sum(piece.nbytes for piece in part_pieces(data)))
        return await original(self, key, upload_id, number, data, **kw)

    monkeypatch.setattr(MemoryStore, "multipart_upload_part", spy)
    return sizes


def test_parts_grow_so_a_checkpoint_fits_the_part_limit(part_sizes: list[int]) -> None:
    # Scaled down: 1-byte parts make the 10,000-part limit bite at about 1 MB.
    ckpt = BucketCheckpoint(
        config=CheckpointConfig(part_size=1, min_part_size=1, parts_in_flight=64)
    )
    uri = f"memory://rel-{uuid.uuid4().hex[:8]}/c.pt"
    data = bytes(range(256)) * 80
    with ckpt.writer(uri) as f:
        f.write(data)
    with ckpt.reader(uri) as f:
        assert f.read() == data
    assert len(part_sizes) < len(data)
    assert sorted(set(part_sizes)) == [1, 2, 4, 8, 16]  # doubled every 1,000 parts


def test_a_checkpoint_beyond_the_part_limit_fails_naming_it(part_sizes: list[int]) -> None:
    ckpt = BucketCheckpoint(
        config=CheckpointConfig(part_size=1, min_part_size=1, parts_in_flight=64)
    )
    uri = f"memory://rel-{uuid.uuid4().hex[:8]}/c.pt"
    with (
        pytest.raises(StorageError, match="part_size or pass size_hint") as info,
        ckpt.writer(uri) as f,
    ):
        for _ in range(18):
            f.write(b"y" * 65536)
    assert uri in str(info.value)
    store, _ = ckpt.open(uri)
    assert runtime.run(store.multipart_list("")) == []
    assert not ckpt.exists(uri)


def test_a_torch_save_beyond_the_part_limit_fails_naming_it(part_sizes: list[int]) -> None:
    ckpt = BucketCheckpoint(
        config=CheckpointConfig(part_size=1, min_part_size=1, parts_in_flight=64)
    )
    uri = f"memory://rel-{uuid.uuid4().hex[:8]}/c.pt"
    error = raises(StorageError, uri, lambda: ckpt.save({"w": torch.zeros(300_000)}, uri))
    # What the user sees is torchbucket's error, not torch's "unexpected pos".
    assert "part_size or pass size_hint" in str(error)
    assert "10000 parts" in str(error)
    store, _ = ckpt.open(uri)
    assert runtime.run(store.multipart_list("")) == []
    assert not ckpt.exists(uri)


# -- unusual names ----------------------------------------------------------------

UNUSUAL = [
    "d/with space.bin",
    "d/ünïcødé-名前.bin",
    "d/hash#frag.bin",
    "d/question?x=1&y=2.bin",
    "d/percent%20%2F%zz.bin",
    "d/plus+sign.bin",
    "d/semi;colon,comma=eq.bin",
    "d/quote'double\"back\\slash.bin",
    "d/" + "long-" * 200 + ".bin",  # 1,007 bytes: near GCS's 1,024-byte limit
]


def test_unusual_names(emulator: Emulator, make_bucket: Callable[[Emulator], Bucket]) -> None:
    check_unusual_names(make_bucket(emulator))


def test_unusual_names_on_fake_gcs(
    fake_gcs: Emulator, make_bucket: Callable[[Emulator], Bucket]
) -> None:
    check_unusual_names(make_bucket(fake_gcs))


def check_unusual_names(bucket: Bucket) -> None:
    emu = bucket.emu
    objects = {name: f"bytes of {name}".encode() for name in UNUSUAL}
    objects["d/zz-plain.bin"] = b"plain"
    emu.seed(bucket.name, objects)
    want = [objects[k] for k in sorted(objects)]
    for compose in (True, False):
        assert list(bucket.dataset(PATIENT, compose=compose)) == want
    mds = BucketMapDataset.from_objects([bucket.uri(name) for name in UNUSUAL], gcs=gcs(emu))
    assert [mds[i] for i in range(len(UNUSUAL))] == [objects[n] for n in UNUSUAL]
    ckpt = bucket.checkpoint(PATIENT)
    for name in UNUSUAL[:-1]:
        uri = bucket.uri("ck/" + name.removeprefix("d/"))
        ckpt.save({"name": name}, uri)
        assert ckpt.load(uri) == {"name": name}
    assert bucket.composites() == []
    assert bucket.incomplete_uploads() == []


# -- data_format_fn raising ---------------------------------------------------------


def _failing_format(data: bytes) -> Any:
    if data == payload(7):
        raise ValueError("cannot decode this sample")
    return data


@pytest.mark.parametrize("workers", [0, 1])
def test_data_format_fn_raising_names_the_object(model_bucket: Bucket, workers: int) -> None:
    model_bucket.seed_dataset(20)
    ds = BucketMapDataset.from_prefix(
        model_bucket.uri("d/"), data_format_fn=_failing_format, gcs=gcs(model_bucket.emu)
    )
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=workers,
        collate_fn=list,
        multiprocessing_context="fork" if workers else None,
    )
    batches = iter(loader)
    try:
        with pytest.raises(ValueError, match="cannot decode this sample") as info:
            for _ in batches:
                pass
    finally:
        # Not left to the garbage collector: a live worker holds inherited
        # descriptors (the emulator's stdin among them) until it exits.
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    uri = model_bucket.uri(object_name(7))
    if workers:
        assert uri in str(info.value)  # the worker's traceback, notes included
    else:
        assert any(uri in note for note in getattr(info.value, "__notes__", []))
