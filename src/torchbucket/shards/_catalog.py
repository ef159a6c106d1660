"""The shards a dataset reads: from a manifest, or every ``.tar`` under a prefix.

Listed and indexed once, in the constructor (the main process, before
DataLoader workers start). Reads are pinned to the listed generations.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchbucket import runtime
from torchbucket._uri import as_uri, parse_uri
from torchbucket.errors import ConfigError, IntegrityError, NotFoundError
from torchbucket.listing import alist_objects
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.shards._index import (
    MANIFEST_NAME,
    Manifest,
    ManifestShard,
    ShardIndex,
    index_name,
)
from torchbucket.storage import store_for
from torchbucket.storage.base import ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from torchbucket.listing import ListingConfig
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["ShardSet", "open_store"]

logger = logging.getLogger(__name__)


def open_store(uri: str, gcs: GCSConfig | None) -> tuple[ObjectStore, str]:
    """The store and key of ``uri``; ``gcs`` applies to ``gs://`` only."""
    parsed = parse_uri(uri)
    if parsed.scheme == "gs" and gcs is not None:
        return store_for(parsed, config=gcs)
    return store_for(parsed)


@dataclass(frozen=True, slots=True)
class ShardSet:
    """Shards in order, each with its index where it has one.

    Attributes:
        store: The store holding them.
        shards: The shard objects as listed.
        indexes: Per shard, its index or ``None`` (a shard not written by
            torchbucket, read by streaming its headers).
        group_by: ``"key"`` or ``"none"`` as packed (``"key"`` without a manifest).
    """

    store: ObjectStore
    shards: tuple[ObjectInfo, ...]
    indexes: tuple[ShardIndex | None, ...]
    group_by: str

    def __len__(self) -> int:
        return len(self.shards)

    @property
    def indexed(self) -> bool:
        """Whether every shard has an index."""
        return all(i is not None for i in self.indexes)

    def uri(self, shard: int) -> str:
        """The URI of shard ``shard``."""
        return self.store.uri(self.shards[shard].name)

    def index(self, shard: int) -> ShardIndex:
        """The index of shard ``shard``.

        Raises:
            ConfigError: It has none.
        """
        index = self.indexes[shard]
        if index is None:
            raise ConfigError(
                f"{self.uri(shard)} has no index ({index_name(self.shards[shard].name)}): "
                "pack it with `torchbucket pack` for random access"
            )
        return index

    @classmethod
    def open(
        cls,
        uri: str | os.PathLike[str],
        *,
        gcs: GCSConfig | None = None,
        listing: ListingConfig | None = None,
    ) -> ShardSet:
        """The shards of a manifest URI (``.../manifest.json``) or of a prefix.

        A prefix with a ``manifest.json`` reads that; otherwise every ``.tar``
        under it, in name order, with the index beside each where there is one.

        Raises:
            NotFoundError: No manifest and no ``.tar`` under the prefix, or a
                shard of the manifest is missing.
        """
        uri = as_uri(uri, directory=True)
        store, key = open_store(uri, gcs)
        return runtime.run(_open(store, key, uri, listing))


def _check_packed_with(
    store: ObjectStore, entry: ManifestShard, info: ObjectInfo, index: ShardIndex | None
) -> None:
    """Refuse a shard (and its index) that another pack wrote than the manifest's.

    Two packs to one place (or a shard packed again since) leave shards of one
    pack under the other's manifest: read together they would mix the two
    packs' samples. The index records the CRC32C of the shard it was written
    with, and the manifest the same, so the two must agree; a shard without an
    index is compared as listed. (Damage to a shard after its pack is not this:
    its index still agrees, and each member read is checked against the index.)

    Raises:
        IntegrityError: The shard's index, or the listed shard, is not the
            one the manifest describes.
    """
    size, crc, what = info.size, info.crc32c, "the shard"
    if index is not None:
        size, crc, what = index.size, index.shard_crc32c, "its index"
    if size == entry.size and not (crc and entry.crc32c and crc != entry.crc32c):
        return
    raise IntegrityError(
        f"{what} ({size} bytes, crc32c {crc}) is not the shard the manifest describes "
        f"({entry.size} bytes, crc32c {entry.crc32c}): packed again since the manifest was "
        "written (by another pack to the same place?); pack the set again",
        operation="open",
        uri=store.uri(info.name),
    )


async def _open(store: ObjectStore, key: str, uri: str, listing: ListingConfig | None) -> ShardSet:
    if key.endswith(".json"):
        prefix = key[: key.rfind("/") + 1]
        manifest_key: str | None = key
    else:
        prefix = key if not key or key.endswith("/") else key + "/"
        manifest_key = None
    objects = await alist_objects(store, prefix, config=listing)
    by_name = {o.name: o for o in objects}
    if manifest_key is None and prefix + MANIFEST_NAME in by_name:
        manifest_key = prefix + MANIFEST_NAME
    if manifest_key is not None:
        try:
            manifest = Manifest.from_json(await store.get(manifest_key))
        except ValueError as exc:
            raise ConfigError(f"{store.uri(manifest_key)}: {exc}") from exc
        shards = []
        entries = {prefix + entry.name: entry for entry in manifest.shards}
        for entry in manifest.shards:
            info = by_name.get(prefix + entry.name)
            if info is None:
                raise NotFoundError(
                    "a shard of the manifest is missing",
                    operation="open",
                    uri=store.uri(prefix + entry.name),
                )
            shards.append(info)
        group_by = manifest.group_by
    else:
        shards = [
            o for o in objects if o.name.endswith(".tar") and "/" not in o.name[len(prefix) :]
        ]
        group_by = "key"
        entries = {}
    if not shards:
        raise NotFoundError("no shards (.tar) and no manifest", operation="open", uri=uri)

    async def index_of(info: ObjectInfo) -> ShardIndex | None:
        name = index_name(info.name)
        if name not in by_name:
            entry = entries.get(info.name)
            if entry is not None:
                _check_packed_with(store, entry, info, None)
            return None
        try:
            index = ShardIndex.from_json(await store.get(name, generation=by_name[name].generation))
        except ValueError as exc:
            raise ConfigError(f"{store.uri(name)}: {exc}") from exc
        if index.size != info.size:
            # Not raised here: the samples it still holds are readable, and
            # reading one it lost fails naming the shard and the member.
            logger.warning(
                "%s is %d bytes, its index says %d: truncated or rewritten since it was packed",
                store.uri(info.name),
                info.size,
                index.size,
            )
        entry = entries.get(info.name)
        if entry is not None:
            _check_packed_with(store, entry, info, index)
        return index

    indexes = await gather_or_cancel(index_of(s) for s in shards)
    logger.debug("%s: %d shards, %d indexed", uri, len(shards), sum(i is not None for i in indexes))
    return ShardSet(store, tuple(shards), tuple(indexes), group_by)
