"""Contender rank of ``benchmarks/scale.py``: one rank of a job reading small objects.

Started by ``torch.distributed.run`` (gloo), one process per rank, in the
contender's environment. Every rank builds its dataset (listing is setup),
meets the others at a barrier; rank 0 then installs the emulator's
request-rate model cold and resets its counters; after a second barrier each
rank reads its shard (``DistributedSampler``, shuffled) through
``DataLoader(num_workers, batch_size)`` and writes what it saw to
``{out}/rank{RANK}.json``: samples, its end time, one ``[t, n]`` per batch
(seconds since the common start), and for torchbucket its workers' request
counts and its budget's state; rank 0 adds the rate model's timeline.

Every contender makes one GET per sample (compose off): the rate model counts
object reads.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``kind`` (``"tb"``: torchbucket map-style, the budget as
``$TORCHBUCKET_BUDGET`` says; ``"dataflux"``: gcs-torch-dataflux map-style,
``threads`` per worker; ``"gcsfs"``: a map-style dataset whose batch is one
``fs.cat``), ``batch_size``, ``num_workers``, ``rate_model`` (the emulator's
fields), ``out``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch.distributed as dist
from _common import generated_names, identity_collate, load_spec
from torch.utils.data import DataLoader, DistributedSampler

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def admin(endpoint: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{endpoint}/_emulator/{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with _OPENER.open(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")


def make_dataset(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind == "tb":
        from torchbucket.compose import ComposeConfig
        from torchbucket.datasets import BucketMapDataset
        from torchbucket.storage.gcs import GCSConfig

        uri = f"gs://{spec['bucket']}/{spec['prefix']}"
        gcs = GCSConfig(endpoint=spec["endpoint"])
        return BucketMapDataset.from_prefix(uri, gcs=gcs, compose=ComposeConfig(enabled=False))
    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    if kind == "dataflux":
        from dataflux_pytorch import dataflux_mapstyle_dataset

        config = dataflux_mapstyle_dataset.Config(
            prefix=spec["prefix"],
            threads_per_process=int(spec.get("threads", 8)),
            disable_compose=True,
        )
        return dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
            project_name="test", bucket_name=spec["bucket"], config=config
        )
    from gcsfs_cat_loader import GcsfsCatDataset

    return GcsfsCatDataset(spec["bucket"], generated_names(spec["prefix"], spec["count"]))


def body_len(sample: Any) -> int:
    if isinstance(sample, tuple):
        sample = sample[-1]
    return len(sample)


def main() -> None:
    spec = load_spec()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset(spec)
    if len(dataset) != spec["count"]:
        raise SystemExit(f"rank {rank}: {len(dataset)} objects, expected {spec['count']}")
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=spec["seed"])
    loader = DataLoader(
        dataset,
        sampler=sampler,
        batch_size=spec["batch_size"],
        num_workers=spec["num_workers"],
        collate_fn=identity_collate,
    )
    dist.barrier()
    if rank == 0:
        admin(spec["endpoint"], "POST", "rate_model", {"model": spec["rate_model"]})
        admin(spec["endpoint"], "POST", "stats/reset", {})
    dist.barrier()
    t0 = time.time()
    batches: list[list[float]] = []
    samples = 0
    for batch in loader:
        for sample in batch:
            if body_len(sample) != spec["size"]:
                raise SystemExit(f"rank {rank}: a sample of {body_len(sample)} bytes")
        samples += len(batch)
        batches.append([round(time.time() - t0, 4), len(batch)])
    t_end = time.time() - t0
    result: dict[str, Any] = {"rank": rank, "samples": samples, "t_end": t_end, "batches": batches}
    stats = getattr(dataset, "last_epoch_stats", None)
    if stats is not None:
        result["client"] = stats.to_dict()
    if spec["kind"] == "tb":
        from torchbucket.runtime import budget

        result["budget"] = budget.status()
    # No barrier here: a rank that finishes first must not wait on the others'
    # collectives; rank 0 reads the model once it is done, and the driver
    # reads the model again after every rank has exited.
    if rank == 0:
        result["server"] = admin(spec["endpoint"], "GET", "stats")
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
