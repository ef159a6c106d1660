"""``dataflux_pytorch.lightning``: Lightning checkpoints and DCP storage, under dataflux's names.

::

    # from dataflux_pytorch.lightning import DatafluxLightningCheckpoint
    from torchbucket.dataflux.lightning import DatafluxLightningCheckpoint

``DatafluxLightningCheckpoint`` and ``DatafluxLightningAsyncCheckpoint`` need
PyTorch Lightning; ``GCSDistributedWriter``, ``GCSDistributedReader`` and
``GCSFileSystem`` (the DCP storage, in :mod:`.gcs_filesystem` as in dataflux)
do not: each name loads its module on first use, so DCP code never imports
Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchbucket.dataflux.lightning.dataflux_lightning_checkpoint import (
        DatafluxLightningAsyncCheckpoint,
        DatafluxLightningCheckpoint,
    )
    from torchbucket.dataflux.lightning.gcs_filesystem import (
        GCSDistributedReader,
        GCSDistributedWriter,
        GCSFileSystem,
    )

__all__ = [
    "DatafluxLightningAsyncCheckpoint",
    "DatafluxLightningCheckpoint",
    "GCSDistributedReader",
    "GCSDistributedWriter",
    "GCSFileSystem",
]

_MODULES = {
    "DatafluxLightningAsyncCheckpoint": "dataflux_lightning_checkpoint",
    "DatafluxLightningCheckpoint": "dataflux_lightning_checkpoint",
    "GCSDistributedReader": "gcs_filesystem",
    "GCSDistributedWriter": "gcs_filesystem",
    "GCSFileSystem": "gcs_filesystem",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
