"""Packing and reading tar shards over HTTP against the emulator (model store)."""

from __future__ import annotations

import gc
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from bucket_kinds import stored_names
from gc_helper import frozen_at_first_call
from torchbucket.cli import main
from torchbucket.config import HedgeConfig, RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError
from torchbucket.shards import (
    BucketShardDataset,
    BucketShardMapDataset,
    PackConfig,
    ShardReadConfig,
    pack,
)
from torchbucket.storage.gcs import GCSConfig

# The shared resume check lives with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from resume_helper import check_resumable

pytestmark = pytest.mark.emulator

N = 120
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=20.0, attempt_timeout=10.0, read_timeout=5.0
)


def payload(i: int) -> bytes:
    return f"object-{i:05d};".encode() * (20 + i % 50)


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"sh-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    objects = {f"raw/{i:05d}.bin": payload(i) for i in range(N)}
    objects |= {f"raw/{i:05d}.cls": str(i % 10).encode() for i in range(N)}
    emulator.seed(name, objects)
    return name


def _gcs(emulator: Emulator, hedge: bool = True) -> GCSConfig:
    return GCSConfig(
        endpoint=emulator.endpoint,
        anonymous=True,
        retry=RETRY,
        hedge=HedgeConfig(enabled=hedge),
    )


def _key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def _pack(emulator: Emulator, bucket: str) -> Any:
    return pack(
        f"gs://{bucket}/raw/",
        f"gs://{bucket}/packed/",
        config=PackConfig(shard_size=64 * 1024),
        gcs=_gcs(emulator),
        progress=False,
    )


def test_cli_pack_then_an_epoch_through_workers_reads_each_sample_once(
    emulator: Emulator, bucket: str, capsys: pytest.CaptureFixture[str], bucket_kind: str
) -> None:
    argv = [
        "--endpoint",
        emulator.endpoint,
        "pack",
        f"gs://{bucket}/raw/",
        f"gs://{bucket}/packed/",
    ]
    assert main([*argv, "--shard-size", "64KiB", "--dry-run"]) == 0
    assert "would write" in capsys.readouterr().out
    assert stored_names(emulator, bucket, "packed/") == []
    assert main([*argv, "--shard-size", "64KiB"]) == 0
    assert "0 already complete" in capsys.readouterr().out
    assert main([*argv, "--shard-size", "64KiB"]) == 0  # a rerun keeps every shard
    assert "wrote 0" in capsys.readouterr().out
    shards = [n for n in stored_names(emulator, bucket, "packed/") if n.endswith(".tar")]
    assert len(shards) >= 4
    ds = BucketShardDataset.from_prefix(
        # No hedged reads: the test bounds the requests (a slow read would be hedged).
        f"gs://{bucket}/packed/",
        gcs=_gcs(emulator, hedge=False),
        shuffle=True,
        seed=2,
    )
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda b: [(_key(s), s["bin"], s["cls"]) for s in b],
    )
    emulator.reset_stats()
    got = [s for batch in loader for s in batch]
    stats = emulator.stats()
    assert sorted(k for k, _, _ in got) == [f"{i:05d}" for i in range(N)]
    assert all(data == payload(int(k)) and cls == str(int(k) % 10).encode() for k, data, cls in got)
    # Large ranged reads: a handful of requests for the epoch, not one per sample.
    # On a zonal bucket these fork workers (the parent packed over gRPC) read
    # over the JSON API and find each shard's pointer first (a read refused at
    # the listed generation, then its metadata).
    per_shard = 2 if bucket_kind == "regional" else 4
    assert stats["by_class"].get("B", 0) <= per_shard * len(shards) + 4
    assert stats["by_class"].get("A", 0) == 0


def test_map_dataset_with_a_shuffling_sampler(
    emulator: Emulator, bucket: str, bucket_kind: str
) -> None:
    _pack(emulator, bucket)
    m = BucketShardMapDataset.from_prefix(
        # No hedged reads: the test bounds the requests (a slow read would be hedged).
        f"gs://{bucket}/packed/manifest.json",
        gcs=_gcs(emulator, hedge=False),
        data_format_fn=_key,
    )
    loader = DataLoader(
        m, batch_size=16, shuffle=True, num_workers=2, multiprocessing_context="spawn"
    )
    emulator.reset_stats()
    keys = [k for batch in loader for k in batch]
    assert sorted(keys) == [f"{i:05d}" for i in range(N)] and keys != sorted(keys)
    # On a zonal bucket each worker first finds each shard's pointer (a read
    # refused at the listed generation, then its metadata): fewer than one
    # read per sample all the same.
    assert emulator.stats()["by_class"].get("B", 0) < (N / 2 if bucket_kind == "regional" else N)


def test_corrupt_and_truncated_bodies_are_read_again(emulator: Emulator, bucket: str) -> None:
    _pack(emulator, bucket)
    emulator.add_fault("get", "corrupt", match="shard-000001.tar", count=1)
    emulator.add_fault("get", "truncate", match="shard-000002.tar", count=1)
    ds = BucketShardDataset.from_prefix(
        f"gs://{bucket}/packed/",
        gcs=_gcs(emulator),
        shard_read=ShardReadConfig(first_range_size=4096, range_size=16384),
    )
    samples = list(ds)
    assert [_key(s) for s in samples] == [f"{i:05d}" for i in range(N)]
    assert all(s["bin"] == payload(int(_key(s))) for s in samples)
    assert all(r["fired"] == 1 for r in emulator.faults())


def test_a_shard_corrupt_in_the_bucket_names_the_shard_and_member(
    emulator: Emulator, bucket: str
) -> None:
    import json

    from torchbucket import runtime
    from torchbucket.storage.gcs import GCSStore

    _pack(emulator, bucket)
    store = GCSStore(bucket, config=_gcs(emulator))
    index = json.loads(runtime.run(store.get("packed/shard-000001.idx.json")))
    data = bytearray(runtime.run(store.get("packed/shard-000001.tar")))
    data[index["offsets"][2] + 1] ^= 0x55  # a .bin member (a .cls is 1 byte)
    emulator.seed(bucket, {"packed/shard-000001.tar": bytes(data)})
    runtime.run(store.close())
    ds = BucketShardDataset.from_prefix(f"gs://{bucket}/packed/", gcs=_gcs(emulator))
    with pytest.raises(IntegrityError) as err:
        list(ds)
    assert "shard-000001.tar" in str(err.value) and repr(index["names"][2]) in str(err.value)


def test_resumes_over_http(emulator: Emulator, bucket: str) -> None:
    _pack(emulator, bucket)

    def make() -> BucketShardDataset:
        return BucketShardDataset.from_prefix(
            f"gs://{bucket}/packed/",
            gcs=_gcs(emulator),
            shuffle=True,
            seed=4,
            shard_read=ShardReadConfig(shuffle_buffer=16, first_range_size=2048, range_size=8192),
        )

    check_resumable(make, epochs=2, set_epoch=lambda d, e: d.set_epoch(e), key=_key)


def test_reads_webdataset_shard_writer_output(
    emulator: Emulator, bucket: str, tmp_path: Path
) -> None:
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=25, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"{i:05d}", "bin": payload(i), "cls": b"%d" % (i % 10)})
    emulator.seed(
        bucket, {f"wds/{p.name}": p.read_bytes() for p in sorted(tmp_path.glob("w-*.tar"))}
    )
    ds = BucketShardDataset.from_prefix(f"gs://{bucket}/wds/", gcs=_gcs(emulator))
    samples = list(ds)
    assert [_key(s) for s in samples] == [f"{i:05d}" for i in range(N)]
    assert all(s["bin"] == payload(int(_key(s))) for s in samples)


def test_large_reads_land_in_place_and_survive_corrupt_and_cut_bodies(
    emulator: Emulator, bucket: str
) -> None:
    # Reads of 1 MiB and more take the in-place receive path (RawGetter), which
    # the small reads above do not; members straddle the reads' boundaries.
    big = {f"big/{i:05d}.bin": payload(i) * 100 for i in range(N)}
    emulator.seed(bucket, big)
    pack(
        f"gs://{bucket}/big/",
        f"gs://{bucket}/bigpacked/",
        config=PackConfig(shard_size=3 << 20),
        gcs=_gcs(emulator),
        progress=False,
    )
    emulator.add_fault("get", "corrupt", match="bigpacked/shard-000000.tar", count=1)
    emulator.add_fault("get", "truncate", match="bigpacked/shard-000001.tar", count=1)
    ds = BucketShardDataset.from_prefix(
        f"gs://{bucket}/bigpacked/",
        gcs=_gcs(emulator),
        shard_read=ShardReadConfig(
            first_range_size=1 << 20, range_size=2 << 20, prefetch_size=4 << 20
        ),
    )
    samples = list(ds)
    assert [_key(s) for s in samples] == [f"{i:05d}" for i in range(N)]
    assert all(s["bin"] == big[f"big/{_key(s)}.bin"] for s in samples)
    assert all(r["fired"] == 1 for r in emulator.faults())


def key_seen_by_worker(sample: dict[str, Any]) -> tuple[int, int, str]:
    """A data_format_fn run in the worker: its pid, its frozen count, the key."""
    return (*frozen_at_first_call(), _key(sample))


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("freeze", [True, False])
def test_workers_freeze_the_collector_before_their_first_read(
    emulator: Emulator, bucket: str, kind: str, freeze: bool
) -> None:
    # ShardReadConfig.freeze_gc, as FetchConfig.freeze_gc for the other datasets.
    _pack(emulator, bucket)
    cls = BucketShardMapDataset if kind == "map" else BucketShardDataset
    ds = cls.from_prefix(
        f"gs://{bucket}/packed/",
        gcs=_gcs(emulator),
        data_format_fn=key_seen_by_worker,
        shard_read=ShardReadConfig(freeze_gc=freeze),
    )
    frozen_in_main = gc.get_freeze_count()
    loader = DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context="fork", collate_fn=list
    )
    got = [s for batch in loader for s in batch]
    assert sorted(k for _, _, k in got) == [f"{i:05d}" for i in range(N)]
    assert len({pid for pid, _, _ in got}) == 2
    counts = [count for _, count, _ in got]
    if freeze:
        assert min(counts) > frozen_in_main + 10_000
    else:
        assert set(counts) == {frozen_in_main}
    assert gc.get_freeze_count() == frozen_in_main
