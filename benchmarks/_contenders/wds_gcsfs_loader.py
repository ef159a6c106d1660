"""Contender: the ``webdataset`` package reading tar shards through fsspec (gcsfs).

Runs in ``.venv-gcsfs``. ``gs://`` URLs are opened with ``fsspec.open`` (the
usual recipe for webdataset on GCS without ``gsutil``); gcsfs reaches the
emulator through ``STORAGE_EMULATOR_HOST`` with anonymous credentials.
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` is set: gcsfs 2026.x otherwise
first asks a gRPC API what kind of bucket it is, which an HTTP-only endpoint
never answers. Shards are split over the DataLoader workers by webdataset's
own ``split_by_worker``; every byte is checked in the consumer.

On a zonal bucket (spec ``grpc_endpoint``, ``shards.py --zonal``) each shard
is opened with ``ExtendedGcsFileSystem.open`` on the emulator's gRPC endpoint
(gcsfs's ``ZonalFile``; ``_gcsfs_zonal``), one filesystem per worker.

Spec: ``endpoint``, ``grpc_endpoint`` (optional), ``bucket``, ``prefix``, ``shards`` (object names),
``count``, ``size``, ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("FSSPEC_GCS_TOKEN", "anon")

from typing import Any

import fsspec
import webdataset as wds
from _common import Verifier, load_spec, measure_loader
from _gcsfs_zonal import zonal_filesystem, zonal_of

#: ``(endpoint, grpc_endpoint)`` on a zonal bucket (set before the workers fork).
ZONAL: tuple[str, str] | None = None
_zonal_fs: dict[int, Any] = {}  # pid -> that process's filesystem


def gopen_fsspec(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    if ZONAL is None:
        return fsspec.open(url, mode).open()
    fs = _zonal_fs.get(os.getpid())
    if fs is None:
        fs = _zonal_fs[os.getpid()] = zonal_filesystem(*ZONAL)
    return fs.open(url.removeprefix("gs://"), mode)


class Named:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, sample: dict[str, Any]) -> tuple[str, bytes]:
        return f"{self.prefix}{sample['__key__']}.bin", sample["bin"]


def main() -> None:
    global ZONAL
    spec = load_spec()
    ZONAL = zonal_of(spec)
    # ``webdataset.gopen`` is the function; its module holds the scheme table.
    importlib.import_module("webdataset.gopen").gopen_schemes["gs"] = gopen_fsspec
    urls = [f"gs://{spec['bucket']}/{name}" for name in spec["shards"]]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(Named(spec["prefix"]))
    names = [f"{spec['prefix']}{i:08d}.bin" for i in range(spec["count"])]
    verifier = Verifier(names, spec["size"], 0)
    measure_loader(spec, ds, verifier, names_known=True)


if __name__ == "__main__":
    main()
