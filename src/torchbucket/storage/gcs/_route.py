"""Which path a GCS store's requests take, decided once per process.

``GCSConfig.transport`` ``"http"`` keeps every request on the JSON API;
``"grpc"`` sends reads and writes over gRPC (:mod:`._zonal`); ``"auto"`` asks
the bucket once (:mod:`._layout`) and takes gRPC for a zonal bucket. On the
gRPC path, listing, metadata and deletes stay on the JSON API (pointers
resolved: see :mod:`._zonal`), and compose, copy and multipart upload are
refused as a zonal bucket refuses them (501, which the checkpoint writer takes
for "multipart missing" and answers with one streamed upload).

gRPC channels do not survive ``fork``: a child whose parent had used gRPC
hangs on its first call. A process forked after its parent used gRPC
(a DataLoader worker of a main process that read a zonal object) takes the
JSON API instead, with one WARNING; one forked before, or spawned, opens its
own channel.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import yarl

from torchbucket import runtime
from torchbucket.errors import ConfigError, NotFoundError, StorageError
from torchbucket.storage._common import check_page_size
from torchbucket.storage.base import ListPage
from torchbucket.storage.gcs import _errors, _objects
from torchbucket.storage.gcs._layout import bucket_layout, grpc_target, known_layout
from torchbucket.storage.gcs._pointers import listed_info
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, object_infos, quote_name
from torchbucket.storage.gcs._zonal_json import JsonPointers
from torchbucket.storage.gcs.config import GCSConfig

if TYPE_CHECKING:
    from torchbucket.storage.gcs._zonal import GrpcPath

__all__ = ["Router"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_ZONAL_FIELDS = f"items({INFO_FIELDS},metadata),prefixes,nextPageToken"
_warned: set[str] = set()


class Router:
    """Picks the JSON API or the gRPC path for one store (see the module)."""

    def __init__(self, transport: GCSTransport, config: GCSConfig) -> None:
        self._t = transport
        self._config = config
        self._pid: int | None = None  # the process that decided
        self._path: GrpcPath | None = None
        self._json_pointers: JsonPointers | None = None

    def zonal_now(self) -> bool:
        """Whether the gRPC path is taken, deciding now (blocking) if need be.

        On the loop thread, where blocking is not allowed, an undecided
        ``"auto"`` answers ``False``.
        """
        mode = self._config.transport
        if mode != "auto":
            return mode == "grpc"
        layout = known_layout(self._t)
        if layout is None and not runtime.in_loop_thread():
            runtime.run(self.grpc())
            layout = known_layout(self._t)
        return layout is not None and layout.zonal

    async def grpc(self) -> GrpcPath | None:
        """The gRPC path, or ``None`` for the JSON API."""
        if self._pid == os.getpid():
            return self._path
        self._path = await self._decide()
        self._pid = os.getpid()
        return self._path

    async def _decide(self) -> GrpcPath | None:
        mode = self._config.transport
        if mode == "http":
            return None
        uri = self._t.urls.uri()
        target = grpc_target(self._config, self._t.endpoint)
        # Only where gRPC could be taken is the bucket asked: an emulator
        # without a gRPC endpoint costs no request more than before.
        if mode == "auto" and (target is None or not (await bucket_layout(self._t)).zonal):
            return None
        # Imported only here: grpcio and google-cloud-storage's v2 messages
        # take about 0.16 s to import, which a process on the JSON API (a CLI
        # call, a DataLoader worker) need not pay.
        from torchbucket.storage.gcs import _grpc_wire
        from torchbucket.storage.gcs._zonal_gzip import DecodingGrpcPath

        if mode == "auto" and not _grpc_wire.available():
            self._warn(uri, "grpcio is missing (pip install 'torchbucket[rapid]')")
            return None
        if not _grpc_wire.available():
            raise ConfigError(
                "GCSConfig.transport='grpc' needs grpcio: pip install 'torchbucket[rapid]'"
            )
        if target is None:
            raise ConfigError(
                "GCSConfig.transport='grpc' on an emulator needs GCSConfig.grpc_endpoint "
                "(or $TORCHBUCKET_GCS_GRPC_ENDPOINT)"
            )
        if _grpc_wire.inherited():
            self._warn(
                uri,
                "this process was forked after its parent used gRPC, and gRPC does not "
                "survive fork (read nothing from the bucket before the DataLoader starts, or "
                "use multiprocessing_context='forkserver' or 'spawn')",
            )
            return None
        return DecodingGrpcPath(self._t, self._config, target)

    def _warn(self, uri: str, why: str) -> None:
        if uri not in _warned:
            _warned.add(uri)
            logger.warning("%s: reads and writes take the JSON API, not gRPC: %s", uri, why)

    async def list_page(
        self, prefix: str, page_token: str | None, page_size: int, **params: str | None
    ) -> ListPage:
        """A JSON API list page, pointers shown as their data objects (see :mod:`._zonal`)."""
        check_page_size(page_size)
        query = f"maxResults={page_size}&fields={quote_name(_ZONAL_FIELDS)}"
        for name, value in {"prefix": prefix, **params, "pageToken": page_token}.items():
            if value:
                query += f"&{name}=" + quote_name(value)
        url = yarl.URL(f"{self._t.urls.json_base}/o?{query}", encoded=True)
        uri = self._t.urls.uri(prefix)

        def parse(body: bytes) -> ListPage:
            doc = json.loads(body)
            items: list[dict[str, Any]] = doc.get("items", [])
            infos = [listed_info(d, i) for d, i in zip(items, object_infos(items), strict=True)]
            return ListPage(
                infos, doc.get("nextPageToken") or None, sorted(doc.get("prefixes", ()))
            )

        async def attempt() -> ListPage:
            _, _, body = await self._t.request(
                "GET", url, operation="list", uri=uri, bucket_op=True
            )
            return _errors.parse_body(parse, body, operation="list", uri=uri)

        return await self._t.call(attempt, "list", uri)

    async def delete(self, key: str, generation: int | None) -> None:
        """Delete ``key``; on the gRPC path a pointer's data object with it."""
        path = await self.grpc()
        if path is None:
            await _objects.delete(self._t, key, generation)
            return
        await path.head(key)  # learns whether it is a pointer
        target = path.pointer_of(key)
        if target is not None and generation == target[1]:
            generation = None  # the caller saw the data object's generation
        await path.delete(key, generation)
        await path.after_delete(key)

    async def json_pointers(self) -> JsonPointers | None:
        """On a zonal bucket read over the JSON API (a process forked after its
        parent used gRPC), what follows its pointers; else ``None``."""
        if await self.grpc() is not None or not await self.zonal():
            return None
        if self._json_pointers is None:
            self._json_pointers = JsonPointers(self._t)
        return self._json_pointers

    async def json_name(self, key: str, generation: int | None) -> tuple[str, int | None]:
        """What a JSON API read of ``key`` at ``generation`` asks for: a pointer followed."""
        pointers = await self.json_pointers()
        if pointers is None:
            return key, generation
        return await pointers.resolve(key, generation)

    async def json_read(
        self, key: str, generation: int | None, read: Callable[[str, int | None], Awaitable[T]]
    ) -> T:
        """``read(name, generation)`` over the JSON API, a pointer followed.

        A pinned read goes straight to ``key`` unless ``key`` is a pointer
        followed already; a pointer's name pinned to its data object's
        generation (what listings give) answers 404, and then the name is
        asked. An unpinned read on a zonal bucket asks the name first.
        """
        pointers = await self.json_pointers()
        if pointers is None:
            return await read(key, generation)
        if generation is None or pointers.followed(key, generation):
            return await read(*await pointers.resolve(key, generation))
        try:
            return await read(key, generation)
        except NotFoundError:
            name, gen = await pointers.resolve(key, generation)
            if name == key:
                raise
        return await read(name, gen)

    async def zonal(self) -> bool:
        """Whether the bucket is zonal, as far as this store may ask.

        ``transport="grpc"``: yes. Otherwise the bucket's layout, asked once
        per process, but only where gRPC could be taken (``"auto"`` and a gRPC
        endpoint known); elsewhere what is known already, else no. In a process
        that takes the JSON API on a zonal bucket (forked after gRPC was used)
        it is still zonal: compose and its kin are refused there all the same.
        """
        mode = self._config.transport
        if mode == "grpc":
            return True
        known = known_layout(self._t)
        if known is not None or mode == "http":
            return known is not None and known.zonal
        if grpc_target(self._config, self._t.endpoint) is None:
            return False
        return (await bucket_layout(self._t)).zonal

    async def refuse(self, operation: str, key: str) -> None:
        """Raise 501 for what a zonal bucket does not have."""
        if await self.zonal():
            raise StorageError(
                "a zonal (Rapid) bucket has no compose, copy/rewrite or multipart upload",
                operation=operation,
                uri=self._t.urls.uri(key),
                status=501,
            )

    async def close(self) -> None:
        if self._path is not None and self._pid == os.getpid():
            await self._path.close()
