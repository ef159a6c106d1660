"""Contender: one epoch of a torchbucket dataset through a ``DataLoader``.

The dataset is built (the prefix listed) before the phase, as a training job
does once; the phase covers the ``DataLoader`` (its workers forked, run and
joined) and the consumer's check of every byte.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``kind`` (``"map"`` or ``"iterable"``), ``compose`` (bool), ``batch_size``,
``num_workers``, ``pid_file``.
"""

from __future__ import annotations

from _common import (
    Phase,
    Verifier,
    WorkerPids,
    emit,
    generated_names,
    identity_collate,
    load_spec,
    run_epoch,
)
from torch.utils.data import DataLoader

from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketIterableDataset, BucketMapDataset, FetchConfig
from torchbucket.storage.gcs import GCSConfig


def main() -> None:
    spec = load_spec()
    uri = f"gs://{spec['bucket']}/{spec['prefix']}"
    gcs = GCSConfig(endpoint=spec["endpoint"])
    compose = ComposeConfig(disable=not spec["compose"])
    dataset: BucketMapDataset | BucketIterableDataset
    if spec["kind"] == "map":
        dataset = BucketMapDataset.from_prefix(uri, gcs_config=gcs, compose=compose)
        concurrency = spec["batch_size"]
    else:
        dataset = BucketIterableDataset.from_prefix(uri, gcs_config=gcs, compose=compose)
        concurrency = FetchConfig().prefetch
    names = generated_names(spec["prefix"], spec["count"])
    verifier = Verifier(names, spec["size"], spec.get("seed", 0))
    pids = WorkerPids(spec.get("pid_file"))
    with Phase(spec["endpoint"]) as phase:
        loader = DataLoader(
            dataset,
            batch_size=spec["batch_size"],
            num_workers=spec["num_workers"],
            collate_fn=identity_collate,
            worker_init_fn=pids,
        )
        epoch = run_epoch(loader, verifier)
        del loader
    emit(
        {
            **phase.result(),
            "objects": verifier.finish(),
            "bytes": verifier.bytes,
            **epoch,
            "worker_pids": pids.pids(),
            "in_flight_per_worker": concurrency,
        }
    )


if __name__ == "__main__":
    main()
