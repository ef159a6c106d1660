"""The emulator's google.storage.control.v2 calls: the storage layout and folders.

gcsfs (2026.x ``ExtendedGcsFileSystem``) asks ``GetStorageLayout`` once per
bucket: ``location_type == "zone"`` is a zonal (Rapid) bucket, which it serves
with ``ZonalFile`` over gRPC; ``hierarchical_namespace.enabled`` an HNS bucket,
whose directories it checks with ``GetFolder``. A zonal bucket of the model
store has hierarchical namespace (GCS requires it of one), and its folders
are the implicit ones of its object names: in an HNS bucket, writing
``a/b/c`` creates folders ``a/`` and ``a/b/``
(https://cloud.google.com/storage/docs/hns-overview). Folders made or removed
by the folder API itself are not modelled (CreateFolder, DeleteFolder,
RenameFolder, ListFolders answer UNIMPLEMENTED).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

import grpc
from google.cloud.storage_control_v2.types import storage_control as _control

from torchbucket.emulator._grpc_common import RpcError, bucket_of

if TYPE_CHECKING:
    from torchbucket.emulator._grpc_server import GrpcFront, Tally

__all__ = ["GET_FOLDER", "GET_STORAGE_LAYOUT", "ControlApi"]

GET_STORAGE_LAYOUT = (_control.GetStorageLayoutRequest.pb(), _control.StorageLayout.pb())
GET_FOLDER = (_control.GetFolderRequest.pb(), _control.Folder.pb())
_LAYOUT = "/storageLayout"
_FOLDERS = "/folders/"


class ControlApi:
    """The storage control calls of one :class:`GrpcFront`."""

    def __init__(self, front: GrpcFront) -> None:
        self.g = front
        self.store = front.store

    async def layout(self, request: Any, context: Any, tally: Tally) -> Any:
        """``GetStorageLayout`` of ``projects/_/buckets/NAME/storageLayout``."""
        resource = request.name
        if not resource.endswith(_LAYOUT):
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT, f"name must end in {_LAYOUT}: {resource!r}"
            )
        name = bucket_of(resource[: -len(_LAYOUT)])
        await self.g.admit(context, tally, "bucket_get", name, "")
        await self.g.first_byte("bucket_get")
        found = self.store.bucket(name)
        out = GET_STORAGE_LAYOUT[1]()
        out.name = resource
        out.location = "us-central1-a" if found.zonal else "us-central1"
        out.location_type = "zone" if found.zonal else "region"
        out.hierarchical_namespace.enabled = bool(found.zonal)
        return out

    async def get_folder(self, request: Any, context: Any, tally: Tally) -> Any:
        """``GetFolder`` of ``projects/_/buckets/NAME/folders/PATH``: an implicit folder."""
        resource = request.name
        head, sep, path = resource.partition(_FOLDERS)
        if not sep or not path:
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT, f"name must be .../folders/PATH: {resource!r}"
            )
        bucket = bucket_of(head)
        await self.g.admit(context, tally, "head", bucket, path)
        await self.g.first_byte("head")
        found = self.store.bucket(bucket)
        if not found.zonal:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"bucket {bucket} does not have hierarchical namespace enabled",
            )
        prefix = path.rstrip("/") + "/"
        keys = found.keys
        at = bisect.bisect_left(keys, prefix)
        if at >= len(keys) or not keys[at].startswith(prefix):
            raise RpcError(
                grpc.StatusCode.NOT_FOUND, f"The folder {bucket}/{prefix} does not exist."
            )
        first = found.objects[keys[at]]
        out = GET_FOLDER[1]()
        out.name = f"{head}{_FOLDERS}{prefix}"
        out.metageneration = 1
        out.create_time.FromMicroseconds(first.generation)
        out.update_time.FromMicroseconds(first.generation)
        return out
