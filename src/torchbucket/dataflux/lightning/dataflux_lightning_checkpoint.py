"""dataflux's Lightning ``CheckpointIO`` plugins, on :mod:`torchbucket.lightning`.

::

    # from dataflux_pytorch.lightning import DatafluxLightningCheckpoint
    from torchbucket.dataflux.lightning import DatafluxLightningCheckpoint

    trainer = Trainer(plugins=[DatafluxLightningCheckpoint(project_name="p")])
    trainer.fit(model, dataloader)
    trainer.save_checkpoint("gcs://my-bucket/checkpoints/ckpt.ckpt")

Paths are ``gcs://`` or ``gs://`` URIs, as strings or ``pathlib.Path``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from torchbucket._checks import check_instance
from torchbucket.checkpoint import CheckpointConfig
from torchbucket.dataflux._common import check_names, gcs_config_for
from torchbucket.lightning import AsyncBucketCheckpointIO, BucketCheckpointIO

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["DatafluxLightningAsyncCheckpoint", "DatafluxLightningCheckpoint"]


def _configs(
    plugin: Any,
    project_name: str,
    storage_client: Any,
    disable_multipart: bool,
    config: CheckpointConfig | None,
    gcs: GCSConfig | None,
) -> tuple[CheckpointConfig, GCSConfig]:
    """Check and keep dataflux's attributes; the configs the plugin runs with."""
    owner = type(plugin).__name__
    check_names(owner, project_name, storage_client)
    check_instance(disable_multipart, bool, owner=owner, parameter="disable_multipart")
    check_instance(config, CheckpointConfig, owner=owner, parameter="config")
    plugin.project_name = project_name
    plugin.storage_client = None
    plugin.disable_multipart = disable_multipart
    resolved = config if config is not None else CheckpointConfig()
    if disable_multipart:
        # dataflux then writes one stream; so does a resumable upload.
        resolved = dataclasses.replace(resolved, upload_method="resumable")
    return resolved, gcs_config_for(owner, gcs)


class DatafluxLightningCheckpoint(BucketCheckpointIO):
    """dataflux's ``CheckpointIO``, as :class:`~torchbucket.lightning.BucketCheckpointIO`.

    Args:
        project_name: The GCP project (kept as an attribute).
        storage_client: Accepted, ignored: requests go through aiohttp.
        disable_multipart: Upload each checkpoint as one stream (a resumable
            upload) instead of parallel parts. Default ``False``.
        config: Extension: part sizes and parallelism.
        gcs: Extension: how to reach GCS.

    Raises:
        ConfigError: An argument is not of its type.
    """

    def __init__(
        self,
        project_name: str,
        storage_client: Any = None,
        disable_multipart: bool = False,
        *,
        config: CheckpointConfig | None = None,
        gcs: GCSConfig | None = None,
    ) -> None:
        checkpoint_config, gcs = _configs(
            self, project_name, storage_client, disable_multipart, config, gcs
        )
        super().__init__(checkpoint=checkpoint_config, gcs=gcs)


class DatafluxLightningAsyncCheckpoint(AsyncBucketCheckpointIO):
    """dataflux's ``AsyncCheckpointIO``, as :class:`~torchbucket.lightning.AsyncBucketCheckpointIO`.

    Saves run in a background thread; a failed one is raised by the next call
    or by ``teardown`` (dataflux's, through Lightning's ``AsyncCheckpointIO``,
    did the same at its next save).

    Args:
        project_name: The GCP project (kept as an attribute).
        storage_client: Accepted, ignored.
        disable_multipart: As for :class:`DatafluxLightningCheckpoint`.
        config: Extension: part sizes and parallelism.
        gcs: Extension: how to reach GCS.

    Raises:
        ConfigError: An argument is not of its type.
    """

    def __init__(
        self,
        project_name: str,
        storage_client: Any = None,
        disable_multipart: bool = False,
        *,
        config: CheckpointConfig | None = None,
        gcs: GCSConfig | None = None,
    ) -> None:
        checkpoint_config, gcs = _configs(
            self, project_name, storage_client, disable_multipart, config, gcs
        )
        super().__init__(checkpoint=checkpoint_config, gcs=gcs)
