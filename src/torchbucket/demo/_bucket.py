"""The demo's bucket chores, written as a user would: public APIs only.

Uploading the generated images, counting and listing objects under a prefix,
and finding what a job left behind (composed objects, incomplete uploads) go
through :func:`torchbucket.store_for` and the :class:`~torchbucket.ObjectStore`
it returns, like any program built on torchbucket.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from tqdm import tqdm

from torchbucket import runtime
from torchbucket.errors import BucketNotFoundError, StorageError
from torchbucket.listing import alist_objects
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage import HIDDEN_PREFIXES, MultipartUpload, ObjectInfo, ObjectStore, store_for
from torchbucket.storage.gcs import GCSConfig
from torchbucket.storage.pages import list_all

__all__ = ["Upload", "find_leftovers", "list_uris", "mib", "plural", "upload_folder"]

# A server without the XML multipart API answers listing uploads with one of
# these (fake-gcs-server: 404); there are then no incomplete uploads to find.
_NO_MULTIPART_API = frozenset({404, 405, 501})


@dataclass(frozen=True, kw_only=True, slots=True)
class Upload:
    """What :func:`upload_folder` wrote: ``objects`` of ``bytes`` in ``seconds``."""

    objects: int
    bytes: int
    seconds: float


def _open(uri: str, gcs: GCSConfig) -> tuple[ObjectStore, str]:
    return store_for(uri, config=gcs)


def upload_folder(folder: str, uri: str, gcs: GCSConfig, *, jobs: int = 128) -> Upload:
    """Write every file under ``folder`` to the prefix ``uri``, ``jobs`` at a time."""
    files = sorted(
        os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
        for root, _, names in os.walk(folder)
        for name in names
    )
    store, prefix = _open(uri, gcs)
    started = time.perf_counter()

    async def upload() -> int:
        gate = asyncio.Semaphore(jobs)
        total = 0
        with tqdm(total=len(files), desc="uploading", unit="obj", leave=False) as bar:

            async def one(name: str) -> None:
                nonlocal total
                async with gate:
                    with open(os.path.join(folder, name), "rb") as f:
                        data = f.read()
                    await store.put(prefix + name, data)
                    total += len(data)
                    bar.update(1)

            try:
                await gather_or_cancel(one(name) for name in files)
            finally:
                await store.close()
        return total

    size = runtime.run(upload())
    return Upload(objects=len(files), bytes=size, seconds=time.perf_counter() - started)


def list_uris(uri: str, gcs: GCSConfig) -> list[str]:
    """The URIs of the objects under the prefix ``uri``."""
    store, prefix = _open(uri, gcs)

    async def names() -> list[str]:
        try:
            return [store.uri(o.name) for o in await alist_objects(store, prefix)]
        finally:
            await store.close()

    return runtime.run(names())


async def _hidden(store: ObjectStore) -> list[ObjectInfo]:
    # The ordinary listing hides composed objects; here they are the point.
    return [info for prefix in HIDDEN_PREFIXES for info in await list_all(store, prefix)]


def find_leftovers(uri: str, gcs: GCSConfig) -> tuple[list[ObjectInfo], list[MultipartUpload]]:
    """Composed objects in the bucket and incomplete uploads under the prefix ``uri``."""
    store, prefix = _open(uri, gcs)

    async def find() -> tuple[list[ObjectInfo], list[MultipartUpload]]:
        try:
            composed = await _hidden(store)
            try:
                uploads = await store.multipart_list(prefix)
            except StorageError as exc:
                if isinstance(exc, BucketNotFoundError) or exc.status not in _NO_MULTIPART_API:
                    raise
                uploads = []
            return composed, uploads
        finally:
            await store.close()

    return runtime.run(find())


# The demo is a user of the library (public names only), so it formats its
# own figures; the CLI's human_bytes is torchbucket._human's.
def plural(count: int, noun: str) -> str:
    """``plural(1, "object")`` -> ``"1 object"``; ``plural(2, "object")`` -> ``"2 objects"``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def mib(size: int) -> str:
    """``3_250_000`` -> ``"3.1 MiB"``: the demo's sizes, in MiB with one decimal."""
    return f"{size / (1 << 20):.1f} MiB"
