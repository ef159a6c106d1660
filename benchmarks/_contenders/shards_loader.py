"""Contender: one epoch of ``.bin`` samples through a ``DataLoader`` with torchbucket.

``kind`` ``"shards"``: ``BucketShardDataset`` over the packed shards at
``shards_prefix`` (manifest and indexes read in setup); ``"compose"``:
``BucketIterableDataset`` over the source objects at ``prefix`` with compose
on (listed in setup); ``"iterable"``: the same with the library's defaults
(no compose config given). Every byte is checked in the consumer.

Spec: ``endpoint``, ``grpc_endpoint`` (optional: ``host:port`` of a zonal
bucket's gRPC endpoint, ``shards.py --zonal``), ``bucket``, ``prefix``, ``shards_prefix``, ``count``,
``size``, ``kind``, ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

from typing import Any

from _common import Verifier, load_spec, measure_loader

from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketIterableDataset
from torchbucket.shards import BucketShardDataset
from torchbucket.storage.gcs import GCSConfig


def names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i:08d}.bin" for i in range(count)]


class Named:
    """A shard sample as (object name, body), picklable for DataLoader workers."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, sample: dict[str, Any]) -> tuple[str, bytes]:
        return f"{self.prefix}{sample['__key__']}.bin", sample["bin"]


def main() -> None:
    spec = load_spec()
    grpc_endpoint = f"http://{spec['grpc_endpoint']}" if spec.get("grpc_endpoint") else None
    gcs = GCSConfig(endpoint=spec["endpoint"], grpc_endpoint=grpc_endpoint)
    verifier = Verifier(names(spec["prefix"], spec["count"]), spec["size"], 0)
    if spec["kind"] == "shards":
        ds: Any = BucketShardDataset.from_prefix(
            f"gs://{spec['bucket']}/{spec['shards_prefix']}",
            gcs=gcs,
            data_format_fn=Named(spec["prefix"]),
        )
        measure_loader(spec, ds, verifier, names_known=True, shards=ds.num_shards)
    else:
        compose = ComposeConfig() if spec["kind"] == "compose" else None
        ds = BucketIterableDataset.from_prefix(
            f"gs://{spec['bucket']}/{spec['prefix']}", gcs=gcs, compose=compose
        )
        measure_loader(spec, ds, verifier)


if __name__ == "__main__":
    main()
