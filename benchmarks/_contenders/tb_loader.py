"""Contender: one epoch of a torchbucket dataset through a ``DataLoader``.

The dataset is built (the prefix listed) before the phase, as a training job
does once; the phase covers the ``DataLoader`` (its workers forked, run and
joined) and the consumer's check of every byte.

Spec: ``endpoint``, ``grpc_endpoint`` (optional: a zonal bucket), ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``sizes`` (optional: name -> size, the objects under ``prefix`` being of many sizes),
``shuffle`` (the iterable dataset's, default False),
``kind`` (``"map"``, ``"map_fast"``: map-style with a shuffling
``BucketBatchSampler``, or ``"iterable"``), ``compose`` (bool), ``batch_size``,
``num_workers``, ``pid_file``, ``output`` (``"bytes"``, the default, or
``"tensor"``: samples received into shared-memory tensors and handed over by
handle; measure_loader's identity collate keeps a batch a list of them),
``reuse_shm`` (bool: ``FetchConfig(reuse_shared_memory=...)``, default False),
``fetch_config`` (more ``FetchConfig`` fields), ``loader_shuffle`` (bool:
``DataLoader(shuffle=...)`` for ``"map"``, the plain sampler a user who passes
no sampler shuffles with), ``part`` (``"map"``: read 90% of the objects,
``"split"`` through ``ds.split``'s part, ``"random_split"`` through torch's
``Subset``), ``sampler`` (``"seedable"``, ``"map"``: Accelerate's
``SeedableRandomSampler``), ``collate`` (``"torch"``:
the DataLoader's own ``collate_fn``, as a user who passes none has it;
otherwise measure_loader's identity). ``compose`` null (or left out)
with no ``output`` nor ``fetch_config``: the library's own defaults for both.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from _common import Verifier, load_spec, measure_loader, spec_objects
from torch.utils.data import Subset, random_split

from torchbucket.compose import ComposeConfig
from torchbucket.compose._tuning import TUNING
from torchbucket.config import HedgeConfig
from torchbucket.datasets import (
    BucketBatchSampler,
    BucketIterableDataset,
    BucketMapDataset,
    FetchConfig,
)
from torchbucket.storage.gcs import GCSConfig


def _names_of(dataset: BucketMapDataset) -> list[str]:
    return [dataset.uri(k).split("/", 3)[3] for k in range(len(dataset))]


def main() -> None:
    spec = load_spec()
    uri = f"gs://{spec['bucket']}/{spec['prefix']}"
    # spec "hedge": False turns hedged reads off (dataloading.py --no-hedge);
    # "hedge_factor" / "hedge_floor" set HedgeConfig's (--hedge-factor, --hedge-floor).
    tuned = {k: spec[f"hedge_{k}"] for k in ("factor", "floor") if spec.get(f"hedge_{k}")}
    hedge = HedgeConfig(enabled=spec.get("hedge", True), **tuned)
    # ``grpc_endpoint`` (``host:port``): a zonal bucket, read over the emulator's
    # gRPC endpoint (dataloading.py --zonal); everything else as on a regional one.
    grpc_endpoint = f"http://{spec['grpc_endpoint']}" if spec.get("grpc_endpoint") else None
    gcs = GCSConfig(endpoint=spec["endpoint"], hedge=hedge, grpc_endpoint=grpc_endpoint)
    # ``compose_tuning``: the compose path's hidden knobs for an A/B
    # (benchmarks/tail_epochs.py: the anchor off), set in this process before
    # the DataLoader forks its workers.
    TUNING.update(**spec.get("compose_tuning", {}))
    # ``compose`` None and no ``output``: the library's defaults, as a user who
    # passes neither config gets them (benchmarks/sizes.py); ``fetch_config``
    # adds FetchConfig fields.
    compose: ComposeConfig | None = None
    if spec.get("compose") is not None:
        compose = ComposeConfig(enabled=spec["compose"])
    fetch: FetchConfig | None = None
    if "output" in spec or spec.get("compose") is not None or "fetch_config" in spec:
        fetch = FetchConfig(
            output=spec.get("output", "bytes"),
            reuse_shared_memory=spec.get("reuse_shm", False),
            **spec.get("fetch_config", {}),
        )
    dataset: BucketMapDataset | BucketIterableDataset | Subset[Any]
    loader_kwargs: dict[str, object] = {}
    if spec["kind"] == "map":
        dataset = BucketMapDataset.from_prefix(uri, gcs=gcs, compose=compose, fetch=fetch)
        if spec.get("loader_shuffle"):
            loader_kwargs["shuffle"] = True
        if spec.get("sampler") == "seedable":
            # Hugging Face Accelerate's RandomSampler (the Trainer's default).
            from accelerate.data_loader import SeedableRandomSampler

            loader_kwargs["sampler"] = SeedableRandomSampler(dataset, data_seed=spec["seed"])
        concurrency = spec["batch_size"]
    elif spec["kind"] == "map_fast":
        # The fast path: a BucketBatchSampler (shuffled) the dataset reads ahead of.
        dataset = BucketMapDataset.from_prefix(uri, gcs=gcs, compose=compose, fetch=fetch)
        sampler = BucketBatchSampler(dataset, batch_size=spec["batch_size"], seed=spec["seed"])
        loader_kwargs["batch_sampler"] = sampler
        concurrency = FetchConfig().reads_in_flight
    else:
        dataset = BucketIterableDataset.from_prefix(
            uri, gcs=gcs, compose=compose, fetch=fetch, shuffle=spec.get("shuffle", False)
        )
        concurrency = FetchConfig().reads_in_flight
    names, verifier = spec_objects(spec)
    part = spec.get("part")
    if part is not None:
        # 90% of the objects, drawn as random_split draws them: ds.split's part
        # (a dataset of its own) or random_split's Subset (sizes.py's A/B).
        assert isinstance(dataset, BucketMapDataset)
        generator = torch.Generator().manual_seed(spec["seed"])
        if part == "split":
            dataset = dataset.split([0.9, 0.1], generator=generator)[0]
            where = {n: i for i, n in enumerate(names)}
            indices = [where[n] for n in _names_of(dataset)]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its advice to use split: the A/B's other arm
                subset = random_split(dataset, [0.9, 0.1], generator=generator)[0]
            indices = list(subset.indices)
            dataset = subset
        verifier = Verifier([names[i] for i in indices], spec["size"], int(spec.get("seed", 0)))
    measure_loader(
        spec, dataset, verifier, loader_kwargs=loader_kwargs, in_flight_per_worker=concurrency
    )


if __name__ == "__main__":
    main()
