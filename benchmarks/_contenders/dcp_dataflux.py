"""DCP contender: gcs-torch-dataflux's ``GCSDistributedWriter`` / ``Reader`` on 2 ranks (.venv-bench)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import gcs_client, main_dcp


def _compatible_close() -> None:
    """Make a second ``close()`` of dataflux's upload buffer a no-op, as ``io`` requires.

    torch 2.13's ``FileSystemWriter`` closes the stream inside
    ``create_stream``'s ``with`` block; dataflux 1.4.0's ``create_stream`` then
    closes it again on exit, and its ``close`` (which uploads) fails on the
    already-closed buffer: "ValueError: I/O operation on closed file". The first
    close has uploaded the file; this changes nothing else.
    """
    from dataflux_pytorch.dataflux_checkpoint import DatafluxCheckpointBuffer

    upload_and_close = DatafluxCheckpointBuffer.close

    def close(self: Any) -> None:
        if not self.closed:
            upload_and_close(self)

    DatafluxCheckpointBuffer.close = close  # type: ignore[method-assign]


class Storage:
    """dataflux's DCP storage with its defaults (FileSystemWriter's one thread per rank)."""

    @staticmethod
    def location(args: SimpleNamespace) -> str:
        return f"gs://{args.bucket}/{args.name}"

    @staticmethod
    def prepare(args: SimpleNamespace) -> Any:
        _compatible_close()
        client = gcs_client(args.endpoint)
        client.bucket(args.bucket).blob(f"{args.name}/warm-up").exists()  # opens a connection
        return client

    @staticmethod
    def writer(client: Any, uri: str) -> Any:
        from dataflux_pytorch.lightning import GCSDistributedWriter

        return GCSDistributedWriter(uri, project_name="test", storage_client=client)

    @staticmethod
    def reader(client: Any, uri: str) -> Any:
        from dataflux_pytorch.lightning import GCSDistributedReader

        return GCSDistributedReader(uri, project_name="test", storage_client=client)


if __name__ == "__main__":
    main_dcp(Storage())
