"""Contender: a plain per-object ``Dataset`` on ``google-cloud-storage``.

What a user writes first: ``__getitem__`` downloads one blob with
``blob.download_as_bytes()``; each DataLoader worker makes its own client on
first use. The object names come from the generator (no listing). It reads
only the first ``sample`` objects (it does about 90 objects/s), so its rate
is measured on that sample. Runs in ``.venv-bench``.

Spec: ``endpoint``, ``bucket``, ``prefix``, ``count``, ``size``, ``seed``,
``sample``, ``batch_size``, ``num_workers``, ``pid_file``.
"""

from __future__ import annotations

import os
from typing import Any

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
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from torch.utils.data import DataLoader, Dataset


class PlainGCSDataset(Dataset[tuple[str, bytes]]):
    """One object per item, read with ``download_as_bytes``."""

    def __init__(self, bucket: str, names: list[str]) -> None:
        self.bucket_name = bucket
        self.names = names
        self._bucket: Any = None

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[str, bytes]:
        if self._bucket is None:
            client = storage.Client(project="test", credentials=AnonymousCredentials())
            self._bucket = client.bucket(self.bucket_name)
        name = self.names[index]
        return name, self._bucket.blob(name).download_as_bytes()


def main() -> None:
    spec = load_spec()
    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]
    names = generated_names(spec["prefix"], spec["count"])[: int(spec["sample"])]
    verifier = Verifier(names, spec["size"], spec.get("seed", 0))
    dataset = PlainGCSDataset(spec["bucket"], names)
    pids = WorkerPids(spec.get("pid_file"))
    with Phase(spec["endpoint"]) as phase:
        loader = DataLoader(
            dataset,
            batch_size=spec["batch_size"],
            num_workers=spec["num_workers"],
            collate_fn=identity_collate,
            worker_init_fn=pids,
        )
        epoch = run_epoch(loader, verifier, names_known=True)
        del loader
    emit(
        {
            **phase.result(),
            "objects": verifier.finish(),
            "bytes": verifier.bytes,
            **epoch,
            "worker_pids": pids.pids(),
        }
    )


if __name__ == "__main__":
    main()
