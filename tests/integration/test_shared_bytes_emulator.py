"""Raw ``bytes`` samples handed to the main process through shared memory (``datasets._handover``).

With ``bytes`` output (the default) and no ``data_format_fn``, a DataLoader
worker reads objects of 32 KiB and more (on average) into shared segments and hands each
sample out as a ``bytes`` subclass that pickles as a handle. What must hold:
the main process gets plain ``bytes`` with every object's contents, once
each; a ``collate_fn`` in the worker sees ``bytes`` with the contents (and
torch's own, which reads none, an empty one: no copy in the worker); a
``data_format_fn`` still gets plain ``bytes`` (and turns the hand-over off);
``FetchConfig(shared_bytes=False)``, small objects and a process without
workers keep the plain path.
"""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchbucket.config import RetryConfig
from torchbucket.datasets import (
    BucketBatchSampler,
    BucketIterableDataset,
    BucketMapDataset,
    FetchConfig,
    _shm,
)
from torchbucket.datasets._handover import (
    SHARED_BYTES_FROM,
    HandedBytes,
    goes_straight_to_torchs_collate,
    hand_over,
)
from torchbucket.emulator import Emulator
from torchbucket.storage.gcs import GCSConfig

pytestmark = pytest.mark.emulator

RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)
KIB = 1024


def payload(i: int, size: int) -> bytes:
    unit = f"<handed-{i:04d}>".encode()
    return (unit * (size // len(unit) + 1))[:size]


def _seed(emulator: Emulator, name: str, sizes: list[int]) -> dict[str, bytes]:
    emulator.create_bucket(name)
    objects = {f"s/{i:04d}": payload(i, size) for i, size in enumerate(sizes)}
    emulator.seed(name, objects)
    return objects


def worker_types(batch: list[Any]) -> tuple[list[str], list[Any]]:
    """collate_fn: the type each sample had in the worker, whether it held its bytes, the batch."""
    seen = [f"{type(s).__name__}:{isinstance(s, bytes) and s[:8] == b'<handed-'}" for s in batch]
    return seen, batch


def scribbling(batch: list[Any]) -> list[Any]:
    """collate_fn: take shared segments from the worker's pool and overwrite them.

    A segment that a sample of this batch still lies in (it has not crossed
    yet) must not be handed out again: if it were, the main process would
    read zeros instead of the object.
    """
    for size in [4 << 20, 2 << 20, 1 << 20, 512 << 10, 256 << 10] * 4:
        scratch = _shm.new_shared(size)
        scratch.fill_(0)
        del scratch
    return batch


def exact_type(sample: Any) -> tuple[str, Any]:
    return type(sample).__name__, sample


def _epoch(
    emulator: Emulator, name: str, kind: str, *, workers: int = 2, **options: Any
) -> tuple[set[str], list[Any]]:
    uri = f"gs://{name}/s/"
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    kwargs: dict[str, Any] = {"batch_size": 16}
    ds: Any
    if kind == "map_fast":
        ds = BucketMapDataset.from_prefix(uri, gcs=gcs, **options)
        kwargs = {"batch_sampler": BucketBatchSampler(ds, batch_size=16, seed=5)}
    else:
        ds = BucketIterableDataset.from_prefix(uri, gcs=gcs, **options)
    loader = DataLoader(ds, num_workers=workers, collate_fn=worker_types, **kwargs)
    seen: set[str] = set()
    samples: list[Any] = []
    for types, batch in loader:
        seen.update(types)
        samples.extend(batch)
    return seen, samples


def _check_all(samples: list[bytes], objects: dict[str, bytes]) -> None:
    assert all(type(s) is bytes for s in samples)
    assert sorted(samples) == sorted(objects.values())


@pytest.mark.parametrize("kind", ["map_fast", "iterable"])
def test_raw_samples_cross_as_handles_and_arrive_as_plain_bytes(
    emulator: Emulator, kind: str
) -> None:
    # Mostly 600-900 KiB, a few small ones among them (the mean decides); ~80
    # MiB in all, so that segments are reused while batches are in flight.
    sizes = [(600 + 11 * (i % 30)) * KIB if i % 9 else 3 * KIB + i for i in range(120)]
    objects = _seed(emulator, f"handed-{kind.replace('_', '-')}", sizes)
    seen, samples = _epoch(emulator, f"handed-{kind.replace('_', '-')}", kind)
    assert seen == {"HandedBytes:True"}
    _check_all(samples, objects)


@pytest.mark.parametrize("kind", ["map_fast", "iterable"])
def test_the_plain_path_where_the_hand_over_does_not_apply(emulator: Emulator, kind: str) -> None:
    bucket = f"plain-{kind.replace('_', '-')}"
    objects = _seed(emulator, bucket, [600 * KIB + i for i in range(24)])
    seen, samples = _epoch(emulator, bucket, kind, fetch=FetchConfig(shared_bytes=False))
    assert seen == {"bytes:True"}
    _check_all(samples, objects)
    _, samples = _epoch(emulator, bucket, kind, workers=0)
    _check_all(samples, objects)
    seen, formatted = _epoch(emulator, bucket, kind, data_format_fn=exact_type)
    # data_format_fn gets plain bytes, and what it returns is handed over as it is.
    assert {s.split(":")[0] for s in seen} == {"tuple"}
    assert {t for t, _ in formatted} == {"bytes"}
    _check_all([b for _, b in formatted], objects)


@pytest.mark.parametrize("kind", ["map_fast", "iterable"])
def test_a_segment_is_not_reused_before_its_samples_cross(emulator: Emulator, kind: str) -> None:
    bucket = f"scribble-{kind.replace('_', '-')}"
    objects = _seed(emulator, bucket, [(600 + 13 * i) * KIB for i in range(48)])
    uri = f"gs://{bucket}/s/"
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    ds: Any
    kwargs: dict[str, Any] = {"batch_size": 8}
    if kind == "map_fast":
        ds = BucketMapDataset.from_prefix(uri, gcs=gcs)
        kwargs = {"batch_sampler": BucketBatchSampler(ds, batch_size=8, seed=5)}
    else:
        ds = BucketIterableDataset.from_prefix(uri, gcs=gcs)
    loader = DataLoader(ds, num_workers=2, collate_fn=scribbling, **kwargs)
    _check_all([s for batch in loader for s in batch], objects)


class _Recorder:
    """worker_init_fn: the length of each HandedBytes the worker makes, to a file.

    It wraps the class's ``__new__`` (in that worker only), which adds no
    frame between torch's fetcher and the dataset.
    """

    def __init__(self, log: Path) -> None:
        self.log = log

    def __call__(self, worker_id: int) -> None:
        log = self.log

        def recording_new(cls: type[HandedBytes], *args: Any) -> HandedBytes:
            made = bytes.__new__(cls, *args)
            with log.open("a") as f:
                f.write(f"{cls.__name__}:{len(made)}\n")
            return made

        HandedBytes.__new__ = recording_new  # type: ignore[assignment,method-assign]


class _Reading(Dataset[Any]):
    """A user's dataset around a map-style one: each sample's length and first bytes."""

    def __init__(self, inner: BucketMapDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[int, bytes]:
        sample = self.inner[index]
        return len(sample), bytes(sample[:12])


class _ReadingIterable(IterableDataset[Any]):
    """A user's dataset around an iterable one: each sample's length and first bytes."""

    def __init__(self, inner: BucketIterableDataset) -> None:
        self.inner = inner

    def __iter__(self) -> Any:
        for sample in self.inner:
            yield len(sample), bytes(sample[:12])


def _loader(uri: str, gcs: GCSConfig, kind: str, **kwargs: Any) -> DataLoader[Any]:
    if kind == "map_fast":
        ds = BucketMapDataset.from_prefix(uri, gcs=gcs)
        sampler = BucketBatchSampler(ds, batch_size=16, seed=5)
        return DataLoader(ds, batch_sampler=sampler, num_workers=2, **kwargs)
    stream = BucketIterableDataset.from_prefix(uri, gcs=gcs)
    return DataLoader(stream, batch_size=16, num_workers=2, **kwargs)


@pytest.mark.parametrize("kind", ["map_fast", "iterable"])
@pytest.mark.parametrize("read", ["direct", "composed"])
def test_with_torchs_own_collate_a_worker_copies_nothing_and_every_byte_arrives(
    emulator: Emulator, kind: str, read: str, tmp_path: Path, bucket_kind: str
) -> None:
    # default_collate returns a list of bytes as it is, reading none of them:
    # in the worker each sample is an empty HandedBytes (its bytes stay in the
    # segment, or the composite's tensor), and the main process gets the
    # object's contents.
    bucket = f"own-collate-{kind.replace('_', '-')}-{read}"
    # Composed: past the first objects of each worker's window, read directly.
    kib = (
        [600 + 7 * i for i in range(64)] if read == "direct" else [40 + i % 50 for i in range(480)]
    )
    objects = _seed(emulator, bucket, [k * KIB for k in kib])
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    log = tmp_path / "worker-samples.txt"
    loader = _loader(f"gs://{bucket}/s/", gcs, kind, worker_init_fn=_Recorder(log))
    samples = [s for batch in loader for s in batch]
    _check_all(samples, objects)
    assert log.read_text().splitlines() == ["HandedBytes:0"] * len(objects)
    if read == "composed" and bucket_kind == "regional":  # a zonal bucket refuses compose
        stats = loader.dataset.last_epoch_stats  # type: ignore[attr-defined]
        assert stats.by_op.get("compose", 0) > 0


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_a_users_dataset_around_ours_reads_every_byte_with_torchs_collate(
    emulator: Emulator, kind: str
) -> None:
    # torch's own collate_fn, but the user's dataset reads each sample first:
    # it must get the contents, not an empty HandedBytes.
    bucket = f"wrapped-{kind}"
    objects = _seed(emulator, bucket, [(600 + 7 * i) * KIB for i in range(24)])
    uri = f"gs://{bucket}/s/"
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    wrapped: Any
    if kind == "map":
        wrapped = _Reading(BucketMapDataset.from_prefix(uri, gcs=gcs))
    else:
        wrapped = _ReadingIterable(BucketIterableDataset.from_prefix(uri, gcs=gcs))
    loader = DataLoader(wrapped, batch_size=8, num_workers=2, collate_fn=list)
    got = sorted(pair for batch in loader for pair in batch)
    assert got == sorted((len(b), b[:12]) for b in objects.values())


def test_outside_a_dataloader_nothing_goes_straight_to_torchs_collate() -> None:
    assert goes_straight_to_torchs_collate() is False


def test_small_objects_keep_the_plain_path(emulator: Emulator) -> None:
    # Below SHARED_BYTES_FROM on average (compose, on by default, reads them).
    assert 20 * KIB < SHARED_BYTES_FROM
    objects = _seed(emulator, "handed-small", [20 * KIB + i for i in range(32)])
    seen, samples = _epoch(emulator, "handed-small", "iterable")
    assert seen == {"bytes:True"}
    _check_all(samples, objects)


def test_a_handed_sample_pickles_back_to_plain_bytes() -> None:
    tensor = torch.arange(200, dtype=torch.uint8)
    handed = hand_over(tensor)
    assert isinstance(handed, HandedBytes)
    assert handed == bytes(range(200))
    for dumped in (pickle.dumps(handed), bytes(ForkingPickler.dumps(handed))):
        back = pickle.loads(dumped)
        assert type(back) is bytes
        assert back == bytes(range(200))
    assert hand_over(b"as it was") == b"as it was"
    # The empty one a worker hands torch's own collate_fn pickles its segment's bytes.
    empty = HandedBytes()
    empty._tensor = tensor[10:20]
    assert pickle.loads(pickle.dumps(empty)) == bytes(range(10, 20))
    rebuilt = pickle.loads(bytes(ForkingPickler.dumps(empty)))
    assert type(rebuilt) is bytes
    assert rebuilt == bytes(range(10, 20))
