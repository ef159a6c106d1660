"""Checkpoint contender: ``ckpt_dataflux.py``'s save and load, unchanged, on ``torchbucket.dataflux``.

Runs in the project's ``.venv``. ``DatafluxCheckpoint`` is built as dataflux's
README shows (``project_name``, ``bucket_name``; no ``storage_client``, so the
emulator is found through ``STORAGE_EMULATOR_HOST``), and the save and load are
``ckpt_dataflux``'s own functions: what a user who only changed the import
gets, beside the native ``BucketCheckpoint``.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import main_single
from ckpt_dataflux import load, save

from torchbucket.dataflux import dataflux_checkpoint


def prepare(args: SimpleNamespace) -> Any:
    os.environ["STORAGE_EMULATOR_HOST"] = args.endpoint
    ckpt = dataflux_checkpoint.DatafluxCheckpoint(project_name="test", bucket_name=args.bucket)
    try:  # opens a connection, as ckpt_dataflux's blob.exists() does
        ckpt.reader(f"{args.name}.warm-up")
    except FileNotFoundError:
        pass
    return ckpt


if __name__ == "__main__":
    main_single(prepare, save, load)
