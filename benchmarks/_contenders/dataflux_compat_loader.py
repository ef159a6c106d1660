"""Contender: ``dataflux_loader.py``'s code, unchanged, on ``torchbucket.dataflux``.

Runs in the project's ``.venv``. The package ``dataflux_pytorch`` is made to
resolve to ``torchbucket.dataflux`` before ``dataflux_loader`` is imported, so
the very code that measures gcs-torch-dataflux (its ``Config`` and dataset
constructors as dataflux documents them, ``storage_client`` left out, the
emulator found through ``STORAGE_EMULATOR_HOST``) runs on the compatibility
layer: what a user who only changed the import gets, beside the native API.

Spec: as ``dataflux_loader.py``.
"""

from __future__ import annotations

import sys

import torchbucket.dataflux as compat

sys.modules["dataflux_pytorch"] = compat
sys.modules["dataflux_pytorch.dataflux_iterable_dataset"] = compat.dataflux_iterable_dataset
sys.modules["dataflux_pytorch.dataflux_mapstyle_dataset"] = compat.dataflux_mapstyle_dataset

import dataflux_loader  # noqa: E402 - after the alias, on purpose

if __name__ == "__main__":
    dataflux_loader.main()
