"""Contender: a map-style ``Dataset`` on gcsfs that opens and reads one object per sample.

The first thing an fsspec user writes: ``__getitem__`` does ``with
fs.open(path, "rb") as f: return f.read()``; each DataLoader worker makes its
own ``gcsfs.GCSFileSystem`` on first use; ``DataLoader(shuffle=True)``, no
``__getitems__``, so a worker fetches its batch one object after another. The
object names come from the generator (no listing). Like the plain
google-cloud-storage ``Dataset`` it is latency-bound, so it reads the first
``sample`` objects and its rate is measured on them. Runs in ``.venv-gcsfs``;
the emulator through ``STORAGE_EMULATOR_HOST`` with ``token="anon"``;
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (gcsfs 2026.x otherwise first asks
a gRPC API what kind of bucket it is, which an HTTP-only endpoint never
answers).

On a zonal bucket (spec ``grpc_endpoint``, ``dataloading.py --zonal``) the
filesystem is gcsfs's ``ExtendedGcsFileSystem`` on the emulator's gRPC
endpoint (``_gcsfs_zonal``), made in each worker.

Spec: ``endpoint``, ``grpc_endpoint`` (optional), ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``sample``, ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from typing import Any

from _common import Verifier, generated_names, load_spec, measure_loader
from _gcsfs_zonal import filesystem, zonal_of
from torch.utils.data import Dataset


class GcsfsOpenDataset(Dataset[tuple[str, bytes]]):
    """One object per item, read through ``fs.open``."""

    def __init__(self, bucket: str, names: list[str], zonal: tuple[str, str] | None) -> None:
        self.bucket = bucket
        self.names = names
        self.zonal = zonal
        self._fs: Any = None

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[str, bytes]:
        if self._fs is None:
            self._fs = filesystem(self.zonal)
        name = self.names[index]
        with self._fs.open(f"{self.bucket}/{name}", "rb") as f:
            return name, f.read()


def main() -> None:
    spec = load_spec()
    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    names = generated_names(spec["prefix"], spec["count"])[: int(spec["sample"])]
    verifier = Verifier(names, spec["size"], spec.get("seed", 0))
    dataset = GcsfsOpenDataset(spec["bucket"], names, zonal_of(spec))
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
