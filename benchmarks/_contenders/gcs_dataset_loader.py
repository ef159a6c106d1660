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
    Verifier,
    generated_names,
    load_spec,
    measure_loader,
)
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from torch.utils.data import Dataset


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
    measure_loader(spec, dataset, verifier, names_known=True)


if __name__ == "__main__":
    main()
