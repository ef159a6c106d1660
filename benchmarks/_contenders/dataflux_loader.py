"""Contender: one epoch of ``gcs-torch-dataflux`` 1.4.0 through a ``DataLoader``.

Runs in ``.venv-bench``. The datasets are built as their documentation shows,
with ``storage_client=None``: with ``STORAGE_EMULATOR_HOST`` set, every client
dataflux makes itself (in its listing processes and, lazily, in each
DataLoader worker) talks to the emulator anonymously, and no client's pooled
connections are shared across a fork. Listing (dataflux's parallel lister) is
setup, outside the phase.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``list_prefix`` (optional: the prefix dataflux lists, narrower than
``prefix`` where it reads only the first ``count`` objects there), ``kind``
(``"map"`` or ``"iterable"``), ``compose`` (bool), ``threads`` (map-style
``threads_per_process``), ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import os

from _common import (
    load_spec,
    measure_loader,
    spec_objects,
)
from dataflux_pytorch import dataflux_iterable_dataset, dataflux_mapstyle_dataset


def main() -> None:
    spec = load_spec()
    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    prefix = spec.get("list_prefix", spec["prefix"])
    if spec["kind"] == "map":
        config = dataflux_mapstyle_dataset.Config(
            prefix=prefix,
            threads_per_process=int(spec.get("threads", 1)),
            disable_compose=not spec["compose"],
        )
        dataset = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
            project_name="test", bucket_name=spec["bucket"], config=config
        )
    else:
        config = dataflux_iterable_dataset.Config(
            prefix=prefix, disable_compose=not spec["compose"]
        )
        dataset = dataflux_iterable_dataset.DataFluxIterableDataset(
            project_name="test", bucket_name=spec["bucket"], config=config
        )
    listed = len(dataset.objects)
    if listed != spec["count"]:
        raise SystemExit(f"dataflux listed {listed} objects, expected {spec['count']}")
    _, verifier = spec_objects(spec)
    measure_loader(spec, dataset, verifier)


if __name__ == "__main__":
    main()
