"""gcsfs on a zonal (Rapid) bucket of the emulator, over its gRPC endpoint.

Shared by every benchmark that pits torchbucket against gcsfs on a zonal
bucket (``benchmarks/zonal.py``, ``dataloading.py --zonal``, ``shards.py
--zonal``). gcsfs 2026.x's ``ExtendedGcsFileSystem`` routes a zonal bucket to
its ``ZonalFile`` (reads through google-cloud-storage's
``AsyncMultiRangeDownloader``, writes through ``AsyncAppendableObjectWriter``)
and its batched ``cat`` to the same downloader. It sends gRPC to its HTTP
host; the emulator's gRPC front is another port, so the two gRPC clients it
makes are replaced by ones for that port, as
``tests/integration/test_emulator_grpc_gcsfs.py`` does. Nothing else of
gcsfs is changed: what is measured is its own code.

Call :func:`zonal_filesystem` in the process that uses it (a DataLoader
worker makes its own on first use: gRPC does not survive ``fork``).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["filesystem", "zonal_filesystem", "zonal_of"]


def zonal_filesystem(endpoint: str, grpc_endpoint: str) -> Any:
    """An ``ExtendedGcsFileSystem`` on the emulator at ``endpoint`` (HTTP) and
    ``grpc_endpoint`` (``host:port``), anonymous, not cached.

    Imports gcsfs and grpc here, so a parent process that only forks the
    workers never loads gRPC.
    """
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import grpc
    from fsspec import asyn
    from gcsfs import extended_gcsfs
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage_control_v2
    from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient

    fs = extended_gcsfs.ExtendedGcsFileSystem(
        endpoint_url=endpoint, token="anon", skip_instance_cache=True
    )

    async def clients() -> None:
        fs._grpc_client = AsyncGrpcClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=grpc_endpoint),
        )
        transports = storage_control_v2.services.storage_control.transports
        fs._storage_control_client = storage_control_v2.StorageControlAsyncClient(
            transport=transports.StorageControlGrpcAsyncIOTransport(
                channel=grpc.aio.insecure_channel(grpc_endpoint)
            )
        )

    asyn.sync(fs.loop, clients)
    return fs


def zonal_of(spec: dict[str, Any]) -> tuple[str, str] | None:
    """``(endpoint, grpc_endpoint)`` of a contender's spec on a zonal bucket, else ``None``."""
    grpc_endpoint = spec.get("grpc_endpoint")
    return (spec["endpoint"], grpc_endpoint) if grpc_endpoint else None


def filesystem(zonal: tuple[str, str] | None) -> Any:
    """gcsfs's filesystem: :func:`zonal_filesystem` on ``zonal``, else the
    plain ``GCSFileSystem`` (``STORAGE_EMULATOR_HOST``, anonymous)."""
    if zonal is not None:
        return zonal_filesystem(*zonal)
    import gcsfs

    return gcsfs.GCSFileSystem(token="anon")
