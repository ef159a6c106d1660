"""gcsfs's ``ExtendedGcsFileSystem`` and ``ZonalFile``, unchanged, on a zonal bucket of the emulator.

gcsfs sends its gRPC calls to the host of its HTTP ``endpoint_url``; the
emulator serves gRPC on a port of its own, so the test hands the file system
its two gRPC clients (the storage client and the storage control client, as
gcsfs would build them for an anonymous endpoint, an insecure channel each)
through the attributes gcsfs keeps them in. Everything else is gcsfs's own
path: the storage layout call tells it the bucket is zonal, reads go through
``AsyncMultiRangeDownloader`` and writes through ``AsyncAppendableObjectWriter``.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

# As tests/integration/test_emulator_gcsfs.py does, before gcsfs is imported:
# its plain GCSFileSystem stays the JSON API one (whichever module imports
# gcsfs first); this test builds ExtendedGcsFileSystem by its own name.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
pytest.importorskip("grpc")
extended = pytest.importorskip("gcsfs.extended_gcsfs")
import google_crc32c  # noqa: E402
import grpc  # noqa: E402
from fsspec import asyn  # noqa: E402
from google.api_core.client_options import ClientOptions  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402
from google.cloud import storage_control_v2  # noqa: E402
from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient  # noqa: E402

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(grpc=True) as emu:
        yield emu


@pytest.fixture
def fs(emu: Emulator) -> Iterator[Any]:
    fs = extended.ExtendedGcsFileSystem(
        endpoint_url=emu.endpoint, token="anon", skip_instance_cache=True
    )
    endpoint = str(emu.grpc_endpoint)

    async def clients() -> None:
        fs._grpc_client = AsyncGrpcClient(
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=endpoint),
        )
        transports = storage_control_v2.services.storage_control.transports
        fs._storage_control_client = storage_control_v2.StorageControlAsyncClient(
            transport=transports.StorageControlGrpcAsyncIOTransport(
                channel=grpc.aio.insecure_channel(endpoint)
            )
        )

    asyn.sync(fs.loop, clients)
    try:
        yield fs
    finally:
        asyn.sync(fs.loop, fs._close_resources)  # its pooled streams, before the emulator stops


def _meta(emu: Emulator, bucket: str, name: str) -> dict[str, Any]:
    with _OPENER.open(f"{emu.endpoint}/storage/v1/b/{bucket}/o/{name}", timeout=30) as resp:
        return dict(json.loads(resp.read()))


def test_zonal_file_reads_and_writes_a_zonal_bucket(emu: Emulator, fs: Any) -> None:
    b = f"zf-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(b, zonal=True)
    data = os.urandom(3_000_000)
    emu.seed(b, {"seeded/x.bin": data})
    emu.reset_stats()

    assert str(fs._sync_lookup_bucket_type(b)) == "BucketType.ZONAL_HIERARCHICAL"
    with fs.open(f"{b}/seeded/x.bin", "rb") as f:
        assert type(f).__name__ == "ZonalFile"
        f.seek(1000)
        assert f.read(5000) == data[1000:6000]
    assert fs.cat(f"{b}/seeded/x.bin") == data

    with fs.open(f"{b}/w/new.bin", "wb") as f:
        assert type(f).__name__ == "ZonalFile"
        f.write(b"hello ")
        f.write(data)
    written = b"hello " + data
    assert fs.cat(f"{b}/w/new.bin") == written
    assert fs.info(f"{b}/w/new.bin")["size"] == len(written)
    assert fs.ls(f"{b}/w", detail=False) == [f"{b}/w/new.bin"]
    crc = base64.b64encode(google_crc32c.value(written).to_bytes(4, "big")).decode()
    assert _meta(emu, b, "w/new.bin")["crc32c"] == crc

    by_rpc = emu.stats()["by_rpc"]
    assert by_rpc["GetStorageLayout"] == 1
    assert by_rpc["BidiWriteObject"] >= 1
    assert by_rpc["BidiReadObject"] >= 1
