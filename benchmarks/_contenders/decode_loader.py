"""Contender: one epoch of JPEG images decoded in ``data_format_fn``, through a ``DataLoader``.

``benchmarks/sizes.py --decode``: the objects are JPEG images (a few
variants, object ``i`` is variant ``i % variants``); every contender decodes
each one in its DataLoader workers with the same decoder (Pillow, from the
project's ``.venv``: the harness puts it on ``PYTHONPATH`` for the other
venvs, so every contender runs the same build) into a ``H x W x 3`` uint8
tensor, which the DataLoader hands to the main process as any tensor a user
returns. The consumer checks every decoded image in full: its CRC32C must be
one of the variants' (decoded at setup with the same build), and each
variant must arrive as often as it was stored.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``variants`` (the
decoded CRC32C of each), ``kind``: ``"tb_map"`` (``BucketMapDataset.from_prefix``
with a ``BucketBatchSampler``, every config the library's default),
``"tb_iter"`` (``BucketIterableDataset.from_prefix``, defaults), ``"dataflux"``
(map-style, compose, 8 threads; in ``.venv-bench``), ``"gcsfs"`` (``fs.cat``
of a batch's paths in ``__getitems__``; in ``.venv-gcsfs``) or ``"loop"`` (the
bare aiohttp prototype of ``aiohttp_dataloader.py``, ``prefetch`` coroutines
per worker); ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from _common import (
    Phase,
    WorkerPids,
    crc32c,
    emit,
    generated_names,
    load_spec,
)
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset


def decode(data: Any) -> torch.Tensor:
    """A JPEG's pixels as a ``H x W x 3`` uint8 tensor (what a training step would take)."""
    with Image.open(io.BytesIO(data)) as image:
        return torch.from_numpy(np.asarray(image.convert("RGB")))


def collate(batch: list[Any]) -> list[Any]:
    return batch


class GcsfsCat(Dataset[torch.Tensor]):
    """Objects by index; a batch is one ``fs.cat`` of its paths, each decoded."""

    def __init__(self, bucket: str, names: list[str]) -> None:
        self.paths = [f"{bucket}/{n}" for n in names]
        self._fs: Any = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitems__(self, indices: Sequence[int]) -> list[torch.Tensor]:
        if self._fs is None:
            import gcsfs

            self._fs = gcsfs.GCSFileSystem(token="anon")
        paths = [self.paths[i] for i in indices]
        got = self._fs.cat(paths)
        return [decode(got[p]) for p in paths]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.__getitems__([index])[0]


class DecodedLoop(IterableDataset[torch.Tensor]):
    """The bare prototype's ``(name, body)`` samples, decoded in the worker."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _, body in self.inner:
            yield decode(body)


def dataset_of(spec: dict[str, Any], names: list[str]) -> tuple[Any, dict[str, Any]]:
    """The contender's dataset and its extra DataLoader arguments."""
    kind = spec["kind"]
    uri = f"gs://{spec['bucket']}/{spec['prefix']}"
    if kind in ("tb_map", "tb_iter"):
        from torchbucket.datasets import BucketBatchSampler, BucketIterableDataset, BucketMapDataset
        from torchbucket.storage.gcs import GCSConfig

        gcs = GCSConfig(endpoint=spec["endpoint"])
        if kind == "tb_iter":
            return BucketIterableDataset.from_prefix(uri, gcs=gcs, data_format_fn=decode), {}
        ds = BucketMapDataset.from_prefix(uri, gcs=gcs, data_format_fn=decode)
        sampler = BucketBatchSampler(ds, batch_size=spec["batch_size"], seed=0)
        return ds, {"batch_sampler": sampler}
    if kind == "dataflux":
        from dataflux_pytorch import dataflux_mapstyle_dataset as dms

        os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
        config = dms.Config(prefix=spec["prefix"], threads_per_process=8, disable_compose=False)
        ds = dms.DataFluxMapStyleDataset(
            project_name="test", bucket_name=spec["bucket"], config=config, data_format_fn=decode
        )
        return ds, {"shuffle": True}
    if kind == "gcsfs":
        return GcsfsCat(spec["bucket"], names), {"shuffle": True}
    from aiohttp_dataloader import PrototypeDataset

    inner = PrototypeDataset(spec["endpoint"], spec["bucket"], names, int(spec["prefetch"]))
    return DecodedLoop(inner), {}


def main() -> None:
    spec = load_spec()
    names = generated_names(spec["prefix"], spec["count"])
    variants = [int(v) for v in spec["variants"]]
    expected = {v: 0 for v in variants}
    for i in range(len(names)):
        expected[variants[i % len(variants)]] += 1
    dataset, kwargs = dataset_of(spec, names)
    if "batch_sampler" not in kwargs:
        kwargs["batch_size"] = spec["batch_size"]
    pids = WorkerPids(spec.get("pid_file"))
    seen = dict.fromkeys(variants, 0)
    check_cpu = 0.0
    first_batch_s = 0.0
    with Phase(spec["endpoint"]) as phase:
        t0 = time.perf_counter()
        loader = DataLoader(
            dataset,
            num_workers=spec["num_workers"],
            collate_fn=collate,
            worker_init_fn=pids,
            **kwargs,
        )
        for batch in loader:
            if not first_batch_s:
                first_batch_s = time.perf_counter() - t0
            c0 = time.process_time()
            for image in batch:
                crc = crc32c(image.numpy().reshape(-1))
                if crc not in seen or image.dim() != 3 or image.shape[2] != 3:
                    raise AssertionError(f"a decoded image of no variant ({tuple(image.shape)})")
                seen[crc] += 1
            check_cpu += time.process_time() - c0
        del loader
    if seen != expected:
        raise AssertionError(f"decoded images per variant {seen}, expected {expected}")
    emit(
        {
            **phase.result(),
            "objects": len(names),
            "bytes": 0,
            "check_cpu_s": check_cpu,
            "first_batch_s": first_batch_s,
            "worker_pids": pids.pids(),
        }
    )


if __name__ == "__main__":
    main()
