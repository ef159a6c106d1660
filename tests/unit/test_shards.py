"""Packing into tar shards and reading them back, on the memory store."""

from __future__ import annotations

import asyncio
import io
import itertools
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memory_helper import memory_bucket
from resume_helper import check_resumable
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from torchbucket import runtime
from torchbucket.datasets import ShardingConfig
from torchbucket.errors import ConfigError, IntegrityError, TransientError
from torchbucket.shards import (
    BucketShardDataset,
    BucketShardMapDataset,
    PackConfig,
    ShardReadConfig,
    pack,
)
from torchbucket.storage.memory import MemoryStore

KEYS = 60


def text(i: int) -> bytes:
    return f"caption {i:03d};".encode() * (1 + i % 7)


def image(i: int) -> bytes:
    return bytes([i % 251]) * (300 + 37 * i)


@pytest.fixture
def bucket() -> Iterator[str]:
    jpgs = ((f"raw/{i:04d}.jpg", image(i)) for i in range(KEYS))
    texts = ((f"raw/{i:04d}.txt", text(i)) for i in range(KEYS))
    with memory_bucket("sh", itertools.chain(jpgs, texts)) as name:
        yield name


def _get(bucket: str, key: str) -> bytes:
    return runtime.run(MemoryStore(bucket, create=False).get(key))


def _put(bucket: str, key: str, data: bytes) -> None:
    runtime.run(MemoryStore(bucket, create=False).put(key, data))


def _pack(bucket: str, dst: str = "packed/", **config: Any) -> Any:
    config.setdefault("shard_size", 8192)
    return pack(
        f"memory://{bucket}/raw/",
        f"memory://{bucket}/{dst}",
        config=PackConfig(**config),
        progress=False,
    )


def _key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def test_pack_writes_webdataset_shards_a_tar_reader_understands(bucket: str) -> None:
    result = _pack(bucket)
    assert len(result.shards) > 3 and result.samples == KEYS and result.objects == 2 * KEYS
    seen: dict[str, bytes] = {}
    for s in result.shards:
        data = _get(bucket, f"packed/{s.name}")
        assert len(data) == s.size <= 8192 or len(s.sample_starts) == 1
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
            # A key's members are adjacent and never split over two shards.
            keys = [n.split(".")[0] for n in names]
            assert keys == sorted(keys) and all(keys.count(k) == 2 for k in keys)
            for member in tar.getmembers():
                assert member.mtime == 0 and member.uid == 0 and member.uname == ""
                f = tar.extractfile(member)
                assert f is not None
                seen[member.name] = f.read()
    assert seen == {f"{i:04d}.jpg": image(i) for i in range(KEYS)} | {
        f"{i:04d}.txt": text(i) for i in range(KEYS)
    }
    assert b'"group_by": "key"' in _get(bucket, "packed/manifest.json")


def test_a_pack_result_prints_as_counts_not_its_plan(bucket: str) -> None:
    result = _pack(bucket)
    text = repr(result)
    # The plan holds every member's 512-byte tar header: a print of it ran to
    # half a MB for 256 objects.
    assert len(text) < 300 and "header" not in text and "PlannedMember" not in text
    assert f"shards={len(result.shards)}" in text and f"objects={2 * KEYS}" in text


def test_pack_is_deterministic(bucket: str) -> None:
    a = _pack(bucket, "a/")
    b = _pack(bucket, "b/")
    assert [s.name for s in a.shards] == [s.name for s in b.shards]
    for s in a.shards:
        assert _get(bucket, f"a/{s.name}") == _get(bucket, f"b/{s.name}")


def test_dry_run_writes_nothing_and_reports_the_plan(bucket: str) -> None:
    result = pack(
        f"memory://{bucket}/raw/",
        f"memory://{bucket}/packed/",
        config=PackConfig(shard_size=8192),
        progress=False,
        dry_run=True,
    )
    assert result.dry_run and len(result.shards) > 3 and result.written == ()
    names = runtime.run(MemoryStore(bucket, create=False).list_page("packed/")).objects
    assert names == []


def test_group_by_key_refuses_names_without_extension(bucket: str) -> None:
    _put(bucket, "raw/README", b"x")
    with pytest.raises(ConfigError, match="README"):
        _pack(bucket)
    result = _pack(bucket, group_by="none")
    assert result.samples == 2 * KEYS + 1
    ds = BucketShardDataset.from_prefix(f"memory://{bucket}/packed/")
    assert sorted(ds) == sorted(
        [image(i) for i in range(KEYS)] + [text(i) for i in range(KEYS)] + [b"x"]
    )


class _FailingSource(MemoryStore):
    """A source whose one object cannot be read: the crash in the middle of a pack."""

    fail_on = ""

    async def get(self, key: str, **kw: Any) -> bytes:
        if key == self.fail_on:
            raise TransientError("injected", operation="get", uri=self.uri(key))
        return await super().get(key, **kw)


def test_a_failed_pack_leaves_no_partial_shard_and_a_rerun_keeps_complete_ones(
    bucket: str,
) -> None:
    from torchbucket.shards import apack

    src = _FailingSource(bucket, create=False)
    src.fail_on = "raw/0040.txt"
    dst = MemoryStore(bucket, create=False)
    config = PackConfig(shard_size=8192, shards_in_flight=1)
    with pytest.raises(TransientError):
        runtime.run(apack(src, "raw/", dst, "packed/", config=config, progress=False))
    plan = runtime.run(
        apack(dst, "raw/", dst, "packed/", config=config, progress=False, dry_run=True)
    )
    listed = {o.name: o for o in runtime.run(dst.list_page("packed/")).objects}
    assert "packed/manifest.json" not in listed
    assert runtime.run(dst.multipart_list("packed/")) == []  # the failed upload was aborted
    failed = next(s for s in plan.shards if any(m.name == "0040.txt" for m in s.members))
    assert f"packed/{failed.name}" not in listed
    complete = [s.number for s in plan.shards if f"packed/{s.name}" in listed]
    assert complete and set(complete) == set(plan.kept)
    generations = {n: o.generation for n, o in listed.items()}
    # A leftover upload from a crash is aborted by the rerun.
    runtime.run(dst.multipart_initiate(f"packed/{failed.name}"))
    result = runtime.run(apack(dst, "raw/", dst, "packed/", config=config, progress=False))
    assert set(result.kept) == set(complete) and failed.number in result.written
    after = {o.name: o for o in runtime.run(dst.list_page("packed/")).objects}
    for n in complete:
        name = f"packed/{plan.shards[n].name}"
        assert after[name].generation == generations[name]
    assert runtime.run(dst.multipart_list("packed/")) == []
    ds = BucketShardDataset.from_prefix(f"memory://{bucket}/packed/")
    assert sorted(map(_key, ds)) == [f"{i:04d}" for i in range(KEYS)]


def test_repacking_fewer_shards_deletes_the_stale_ones(bucket: str) -> None:
    small = _pack(bucket, shard_size=8192)
    big = _pack(bucket, shard_size=1 << 20)
    assert len(big.shards) == 1 < len(small.shards)
    names = [
        o.name for o in runtime.run(MemoryStore(bucket, create=False).list_page("packed/")).objects
    ]
    assert names == [
        "packed/manifest.json",
        "packed/shard-000000.idx.json",
        "packed/shard-000000.tar",
    ]


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_once_with_its_members(bucket: str, shuffle: bool) -> None:
    _pack(bucket)
    ds = BucketShardDataset.from_prefix(
        f"memory://{bucket}/packed/",
        shuffle=shuffle,
        seed=5,
        shard_read=ShardReadConfig(first_range_size=1000, range_size=3000, shuffle_buffer=10),
    )
    samples = list(ds)
    assert sorted(map(_key, samples)) == [f"{i:04d}" for i in range(KEYS)]
    for s in samples:
        i = int(s["__key__"])
        assert s["jpg"] == image(i) and s["txt"] == text(i)
        assert s["__url__"].startswith(f"memory://{bucket}/packed/shard-")
    order = list(map(_key, samples))
    assert (order == sorted(order)) != shuffle
    ds.set_epoch(1)
    again = list(map(_key, ds))
    assert (again != order) == shuffle


@pytest.mark.parametrize("uneven", ["keep", "drop", "pad"])
def test_ranks_and_workers_split_the_samples(bucket: str, uneven: str) -> None:
    _pack(bucket)
    world = 4
    counts: Counter[str] = Counter()
    per_rank = []
    for rank in range(world):
        ds = BucketShardDataset.from_prefix(
            f"memory://{bucket}/packed/",
            shuffle=True,
            seed=1,
            sharding=ShardingConfig(rank=rank, world_size=world, uneven=uneven),  # type: ignore[arg-type]
        )
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        keys = [_key(s) for s in loader]
        per_rank.append(len(keys))
        counts.update(keys)
    if uneven == "keep":
        assert sorted(counts) == [f"{i:04d}" for i in range(KEYS)] and set(counts.values()) == {1}
    else:
        assert len(set(per_rank)) == 1
    assert max(counts.values()) <= 2


@pytest.mark.parametrize(("shuffle", "indexed"), [(False, True), (True, True), (True, False)])
def test_resumes_mid_shard_without_replay_or_skip(
    bucket: str, shuffle: bool, indexed: bool, tmp_path: Path
) -> None:
    uri = f"memory://{bucket}/packed/"
    if indexed:
        _pack(bucket)
    else:
        _write_webdataset(bucket, tmp_path)

    def make() -> BucketShardDataset:
        return BucketShardDataset.from_prefix(
            uri,
            shuffle=shuffle,
            seed=7,
            shard_read=ShardReadConfig(first_range_size=512, range_size=2048, shuffle_buffer=8),
        )

    check_resumable(make, epochs=2, set_epoch=lambda d, e: d.set_epoch(e), key=_key)


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_resumes_through_stateful_dataloader(bucket: str, workers: int) -> None:
    _pack(bucket)

    def make() -> StatefulDataLoader:
        ds = BucketShardDataset.from_prefix(
            f"memory://{bucket}/packed/",
            shuffle=True,
            seed=3,
            shard_read=ShardReadConfig(shuffle_buffer=6),
        )
        return StatefulDataLoader(
            ds,
            batch_size=4,
            num_workers=workers,
            collate_fn=lambda b: tuple(map(_key, b)),
            multiprocessing_context="fork" if workers else None,
        )

    check_resumable(make, epochs=2, set_epoch=lambda d, e: d.dataset.set_epoch(e))


def test_state_from_other_shards_is_refused(bucket: str) -> None:
    _pack(bucket)
    _pack(bucket, "other/", shard_size=1 << 20)
    ds = BucketShardDataset.from_prefix(f"memory://{bucket}/packed/")
    it = iter(ds)
    next(it)
    other = BucketShardDataset.from_prefix(f"memory://{bucket}/other/")
    with pytest.raises(ConfigError, match="shards="):
        other.load_state_dict(ds.state_dict())


def _flip(bucket: str, key: str, offset: int) -> None:
    data = bytearray(_get(bucket, key))
    data[offset] ^= 0xFF
    _put(bucket, key, bytes(data))


def test_a_corrupt_member_is_an_error_naming_shard_and_member(bucket: str) -> None:
    _pack(bucket)
    index = _get(bucket, "packed/shard-000001.idx.json")
    import json

    doc = json.loads(index)
    name, offset = doc["names"][1], doc["offsets"][1]
    _flip(bucket, "packed/shard-000001.tar", offset + 3)
    ds = BucketShardDataset.from_prefix(f"memory://{bucket}/packed/")
    with pytest.raises(IntegrityError) as err:
        list(ds)
    assert "shard-000001.tar" in str(err.value) and repr(name) in str(err.value)
    assert "CRC32C" in str(err.value)
    m = BucketShardMapDataset.from_prefix(f"memory://{bucket}/packed/")
    first = m.locate(0)
    assert first == (0, 0)
    bad = next(i for i in range(len(m)) if m.locate(i) == (1, 0))
    with pytest.raises(IntegrityError, match=r"shard-000001\.tar"):
        m[bad]
    assert m[bad + 1]["__key__"]  # other samples of the shard still read


def test_a_truncated_shard_is_an_error_not_a_short_epoch(bucket: str, caplog: Any) -> None:
    _pack(bucket)
    data = _get(bucket, "packed/shard-000002.tar")
    _put(bucket, "packed/shard-000002.tar", data[: len(data) // 2])
    ds = BucketShardDataset.from_prefix(f"memory://{bucket}/packed/")
    with pytest.raises(
        IntegrityError, match=r"shard-000002\.tar.*member '\d{4}\.(jpg|txt)'.*truncated"
    ):
        list(ds)
    assert "truncated or rewritten" in caplog.text


def _write_webdataset(bucket: str, tmp_path: Path, maxcount: int = 13) -> None:
    import webdataset as wds

    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for i in range(KEYS):
            sink.write({"__key__": f"{i:04d}", "jpg": image(i), "txt": text(i)})
    for path in sorted(tmp_path.glob("wds-*.tar")):
        _put(bucket, f"packed/{path.name}", path.read_bytes())


def test_reads_webdataset_shards_without_an_index(bucket: str, tmp_path: Path) -> None:
    _write_webdataset(bucket, tmp_path)
    ds = BucketShardDataset.from_prefix(
        f"memory://{bucket}/packed/",
        shard_read=ShardReadConfig(first_range_size=700, range_size=1500),
    )
    assert ds.num_samples is None and ds.num_shards == 5
    samples = list(ds)
    assert [_key(s) for s in samples] == [f"{i:04d}" for i in range(KEYS)]
    assert all(s["jpg"] == image(int(s["__key__"])) for s in samples)
    with pytest.raises(ConfigError, match="has no index"):
        BucketShardMapDataset.from_prefix(f"memory://{bucket}/packed/")


def test_a_truncated_webdataset_shard_is_an_error(bucket: str, tmp_path: Path) -> None:
    _write_webdataset(bucket, tmp_path)
    data = _get(bucket, "packed/wds-000001.tar")
    # Cut at a block boundary inside the members: the end-of-archive blocks are gone.
    _put(bucket, "packed/wds-000001.tar", data[: (len(data) // 2) // 512 * 512])
    ds = BucketShardDataset.from_prefix(f"memory://{bucket}/packed/")
    with pytest.raises(IntegrityError, match=r"wds-000001\.tar.*truncated"):
        list(ds)


def test_map_dataset_fetches_a_batch_with_few_requests(bucket: str) -> None:
    _pack(bucket)

    class Counting(MemoryStore):
        gets = 0

        async def get(self, key: str, **kw: Any) -> bytes:
            Counting.gets += 1
            return await super().get(key, **kw)

    m = BucketShardMapDataset.from_prefix(f"memory://{bucket}/packed/", data_format_fn=_key)
    assert len(m) == KEYS
    object.__setattr__(m._shards, "store", Counting(bucket, create=False))
    batch = m.__getitems__(list(range(KEYS - 1, -1, -1)))
    assert batch == [f"{i:04d}" for i in range(KEYS - 1, -1, -1)]
    assert Counting.gets <= len(m._shards)  # one GET per shard, not per sample
    loader = DataLoader(m, batch_size=8, shuffle=True)
    assert sorted(k for b in loader for k in b) == [f"{i:04d}" for i in range(KEYS)]
    with pytest.raises(IndexError):
        m[KEYS]


class _Watched(MemoryStore):
    """Records the reads of shards: in flight when each starts, bytes in flight at most."""

    starts: list[tuple[int, int]] = []  # (size, reads in flight before it)
    in_flight = 0
    bytes_in_flight = 0
    peak_bytes = 0

    async def get_into(self, key: str, buffer: memoryview, **kw: Any) -> int:
        cls = type(self)
        cls.starts.append((len(buffer), cls.in_flight))
        cls.in_flight += 1
        cls.bytes_in_flight += len(buffer)
        cls.peak_bytes = max(cls.peak_bytes, cls.bytes_in_flight)
        try:
            await asyncio.sleep(0.003)
            return await super().get_into(key, buffer, **kw)
        finally:
            cls.in_flight -= 1
            cls.bytes_in_flight -= len(buffer)


def test_reads_start_with_one_small_read_and_stay_within_prefetch_size(bucket: str) -> None:
    _pack(bucket, shard_size=1 << 20)
    _Watched.starts, _Watched.peak_bytes = [], 0
    ds = BucketShardDataset.from_prefix(
        f"memory://{bucket}/packed/",
        shard_read=ShardReadConfig(first_range_size=512, range_size=4096, prefetch_size=8192),
    )
    object.__setattr__(ds._shards, "store", _Watched(bucket, create=False))
    samples = list(ds)
    assert sorted(map(_key, samples)) == [f"{i:04d}" for i in range(KEYS)]
    assert all(s["jpg"] == image(int(_key(s))) for s in samples)
    # The first read goes alone and small, so the first samples wait for it only.
    assert _Watched.starts[0] == (512, 0) and _Watched.starts[1][1] == 0
    assert [size for size, _ in _Watched.starts[:4]] == [512, 1024, 2048, 4096]
    # Later reads overlap, within the bytes allowed.
    assert max(n for _, n in _Watched.starts) >= 1
    assert _Watched.peak_bytes <= 8192
