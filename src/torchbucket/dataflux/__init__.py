"""The ``gcs-torch-dataflux`` (``dataflux_pytorch`` 1.4.0) API, on torchbucket.

Change the package prefix and keep the code::

    # from dataflux_pytorch import dataflux_mapstyle_dataset, dataflux_checkpoint
    from torchbucket.dataflux import dataflux_mapstyle_dataset, dataflux_checkpoint
    # from dataflux_pytorch.lightning import DatafluxLightningCheckpoint
    from torchbucket.dataflux.lightning import DatafluxLightningCheckpoint

The modules are dataflux's: :mod:`.dataflux_mapstyle_dataset`,
:mod:`.dataflux_iterable_dataset`, :mod:`.dataflux_checkpoint`,
:mod:`.lightning` (``DatafluxLightningCheckpoint``,
``DatafluxLightningAsyncCheckpoint``; the DCP ``GCSDistributedWriter`` /
``GCSDistributedReader`` in :mod:`.lightning.gcs_filesystem`) and
:mod:`.multipart_upload`. Constructors take dataflux's parameters in dataflux's
order. Each class is a thin subclass of the torchbucket class that does the
work; the README's migration section has the table of what is accepted but not
used and of what differs on purpose.

Importing this package imports neither Lightning nor ``torch.distributed``:
only :mod:`.lightning`'s Lightning plugins need Lightning.

For code written against torchbucket's earlier single-module
``torchbucket.dataflux``, ``DataFluxMapStyleDataset``,
``DataFluxIterableDataset``, ``Config`` (the map-style one) and
``data_format_default`` are also importable from here.
"""

from __future__ import annotations

from torchbucket.dataflux import (
    dataflux_checkpoint,
    dataflux_iterable_dataset,
    dataflux_mapstyle_dataset,
    multipart_upload,
)
from torchbucket.dataflux._common import data_format_default
from torchbucket.dataflux.dataflux_iterable_dataset import DataFluxIterableDataset
from torchbucket.dataflux.dataflux_mapstyle_dataset import Config, DataFluxMapStyleDataset

__all__ = [
    "Config",
    "DataFluxIterableDataset",
    "DataFluxMapStyleDataset",
    "data_format_default",
    "dataflux_checkpoint",
    "dataflux_iterable_dataset",
    "dataflux_mapstyle_dataset",
    "multipart_upload",
]
