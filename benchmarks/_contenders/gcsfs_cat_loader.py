"""Contender: a map-style ``Dataset`` on gcsfs whose ``__getitems__`` calls ``fs.cat(paths)``.

What a user writes in a few lines with fsspec: each DataLoader worker makes
its own ``gcsfs.GCSFileSystem`` on first use, and a batch is fetched with one
``fs.cat`` of its paths (gcsfs gathers them concurrently on its own event
loop). ``DataLoader(shuffle=True)``. The object names come from the
generator (no listing). Runs in ``.venv-gcsfs``; gcsfs reaches the emulator
through ``STORAGE_EMULATOR_HOST`` with anonymous credentials.
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` is set: gcsfs 2026.x otherwise
first asks a gRPC API what kind of bucket it is, which an HTTP-only endpoint
never answers.

On a zonal bucket (spec ``grpc_endpoint``, ``dataloading.py --zonal``) the
filesystem is gcsfs's ``ExtendedGcsFileSystem`` on the emulator's gRPC
endpoint (``_gcsfs_zonal``), made in each worker.

Spec: ``endpoint``, ``grpc_endpoint`` (optional), ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from collections.abc import Sequence
from typing import Any

from _common import load_spec, measure_loader, spec_objects
from _gcsfs_zonal import filesystem, zonal_of
from torch.utils.data import Dataset


class GcsfsCatDataset(Dataset[tuple[str, bytes]]):
    """Objects by index; a batch is one ``fs.cat`` of its paths."""

    def __init__(self, bucket: str, names: list[str], zonal: tuple[str, str] | None) -> None:
        self.bucket = bucket
        self.names = names
        self.zonal = zonal
        self._fs: Any = None

    def __len__(self) -> int:
        return len(self.names)

    def _filesystem(self) -> Any:
        if self._fs is None:
            self._fs = filesystem(self.zonal)
        return self._fs

    def __getitem__(self, index: int) -> tuple[str, bytes]:
        name = self.names[index]
        return name, self._filesystem().cat_file(f"{self.bucket}/{name}")

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[str, bytes]]:
        names = [self.names[i] for i in indices]
        paths = [f"{self.bucket}/{name}" for name in names]
        data = self._filesystem().cat(paths)
        return [(name, data[path]) for name, path in zip(names, paths, strict=True)]


def main() -> None:
    spec = load_spec()
    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    names, verifier = spec_objects(spec)
    dataset = GcsfsCatDataset(spec["bucket"], names, zonal_of(spec))
    measure_loader(
        spec,
        dataset,
        verifier,
        names_known=True,
        loader_kwargs={"shuffle": True},
        gcsfs_zb_hns_support=os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"],
    )


if __name__ == "__main__":
    main()
