"""A shard set whose shards come from two packs is refused, not read as one."""

from __future__ import annotations

import uuid

import pytest

from torchbucket import runtime
from torchbucket.config import RetryConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError
from torchbucket.shards import BucketShardDataset, PackConfig, pack
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator

N = 60
RETRY = RetryConfig(initial_backoff=0.01, max_backoff=0.05, deadline=20.0)


def test_shards_of_two_packs_under_one_manifest_are_refused(emulator: Emulator) -> None:
    bucket = f"mix-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(bucket)
    # Two writers pack different data of the same sizes into one place.
    emulator.seed(bucket, {f"a/{i:04d}.bin": b"A" * (500 + i) for i in range(N)})
    emulator.seed(bucket, {f"b/{i:04d}.bin": b"B" * (500 + i) for i in range(N)})
    gcs = GCSConfig(endpoint=emulator.endpoint, anonymous=True, retry=RETRY)
    store = GCSStore(bucket, config=gcs)
    config = PackConfig(shard_size=8 * 1024)

    def pack_from(src: str) -> None:
        pack(f"gs://{bucket}/{src}/", f"gs://{bucket}/out/", config=config, gcs=gcs, progress=False)

    pack_from("a")
    first = {
        n: runtime.run(store.get(f"out/{n}"))
        for n in ("manifest.json", "shard-000000.tar", "shard-000000.idx.json")
    }
    pack_from("b")
    # Writer A's last uploads (its shard 0, its index and its manifest) land after B's.
    for name, data in first.items():
        runtime.run(store.put(f"out/{name}", data))

    try:
        # Refused when the set is opened: no epoch mixes the two packs' samples.
        with pytest.raises(IntegrityError, match="not the shard the manifest describes"):
            BucketShardDataset.from_prefix(f"gs://{bucket}/out/", gcs=gcs)
    finally:
        runtime.run(store.close())
    # The set packed again as a whole opens and reads one pack's samples.
    pack_from("b")
    ds = BucketShardDataset.from_prefix(f"gs://{bucket}/out/", gcs=gcs)
    assert {bytes(sample["bin"][:1]) for sample in ds} == {b"B"}
