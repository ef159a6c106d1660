"""Which path a bucket takes: zonal (Rapid, gRPC) or regional (the JSON API).

A zonal bucket (Rapid storage) is served over gRPC bidi streams and has no
compose, copy/rewrite or XML multipart upload. The store learns the bucket's
kind once per process and endpoint, from the JSON API's bucket resource
(``locationType`` ``"zone"``, or storage class ``RAPID``; one ``buckets.get``,
class B), unless ``GCSConfig.transport`` says which path to take.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yarl

from torchbucket.errors import PermissionDeniedError
from torchbucket.storage.gcs import _errors
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import quote_name

if TYPE_CHECKING:
    from torchbucket.storage.gcs.config import GCSConfig

__all__ = ["Layout", "bucket_layout", "grpc_target", "known_layout"]

logger = logging.getLogger(__name__)

_FIELDS = "locationType,storageClass,hierarchicalNamespace"
# (endpoint, bucket) -> its layout, for the process's life.
_cache: dict[tuple[str, str], Layout] = {}
# (endpoint, bucket) -> (pid, the question in flight): concurrent first reads
# wait for one answer instead of each asking the bucket.
_asking: dict[tuple[str, str], tuple[int, asyncio.Future[Layout]]] = {}


@dataclass(frozen=True, slots=True)
class Layout:
    """What the store knows of a bucket's storage layout.

    Attributes:
        zonal: A zonal (Rapid) bucket: gRPC, appendable objects, no compose.
        hierarchical: Hierarchical namespace is on (zonal buckets require it).
        known: Asked of the bucket (``False``: the credentials may not read
            its metadata, and it is taken for regional).
    """

    zonal: bool
    hierarchical: bool
    known: bool = True


def known_layout(transport: GCSTransport) -> Layout | None:
    """The layout found earlier in this process, or ``None``."""
    return _cache.get((transport.endpoint, transport.bucket))


async def bucket_layout(transport: GCSTransport) -> Layout:
    """The bucket's layout, asked once per process (``buckets.get``).

    Raises:
        BucketNotFoundError: The bucket does not exist.
    """
    key = (transport.endpoint, transport.bucket)
    layout = _cache.get(key)
    if layout is not None:
        return layout
    loop = asyncio.get_running_loop()
    pending = _asking.get(key)
    if pending is None or pending[0] != os.getpid() or pending[1].get_loop() is not loop:
        task = loop.create_task(_ask(transport, key))
        pending = _asking[key] = (os.getpid(), task)
        task.add_done_callback(lambda done: _done(key, done))
    # Shielded: a caller cancelled leaves the question to the others waiting.
    return await asyncio.shield(pending[1])


def _done(key: tuple[str, str], task: asyncio.Future[Layout]) -> None:
    if _asking.get(key, (0, None))[1] is task:
        del _asking[key]
    if not task.cancelled():
        task.exception()  # retrieved: every waiter has it, or none is left


async def _ask(transport: GCSTransport, key: tuple[str, str]) -> Layout:
    url = yarl.URL(f"{transport.urls.json_base}?fields={quote_name(_FIELDS)}", encoded=True)
    uri = transport.urls.uri()

    async def attempt() -> Layout:
        _, _, body = await transport.request(
            "GET", url, operation="bucket_get", uri=uri, bucket_op=True
        )
        doc = _errors.parse_body(json.loads, body, operation="bucket_get", uri=uri)
        return Layout(
            zonal=doc.get("locationType") == "zone" or doc.get("storageClass") == "RAPID",
            hierarchical=bool((doc.get("hierarchicalNamespace") or {}).get("enabled")),
        )

    try:
        layout = await transport.call(attempt, "bucket_get", uri)
    except PermissionDeniedError:
        logger.info(
            "%s: may not read the bucket's metadata; taking it for a regional bucket "
            "(GCSConfig(transport='grpc') for a zonal one)",
            uri,
        )
        layout = Layout(zonal=False, hierarchical=False, known=False)
    _cache[key] = layout
    if layout.zonal:
        logger.info("%s is a zonal (Rapid) bucket: reads and writes go over gRPC", uri)
    return layout


def grpc_target(config: GCSConfig, endpoint: str) -> tuple[str, bool] | None:
    """``(host:port, secure)`` of the gRPC endpoint, or ``None`` where none is known.

    ``GCSConfig.grpc_endpoint`` or ``$TORCHBUCKET_GCS_GRPC_ENDPOINT`` when set
    (``http://`` plaintext, ``https://`` TLS); Google's own for Google's JSON
    endpoint; none for an emulator that was not given one.
    """
    url = config.grpc_endpoint or os.environ.get("TORCHBUCKET_GCS_GRPC_ENDPOINT", "").strip()
    if not url:
        if not endpoint.startswith("https://storage.googleapis.com"):
            return None
        url = "https://storage.googleapis.com"
    secure = url.startswith("https://")
    host = url.split("://", 1)[-1].rstrip("/")
    if ":" not in host.rpartition("]")[2]:
        host += ":443" if secure else ":80"
    return host, secure
