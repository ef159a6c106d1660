"""Packing the objects under a prefix into tar shards, an index each, and a manifest.

``apack`` lists the source in parallel, plans the shards (:mod:`._plan`),
then writes several shards at once, each through a multipart upload whose
parts go up while the next source objects are read (many in flight). A shard
becomes visible only when its upload completes; its index is written after
it, and the manifest after every shard. A restarted pack keeps each shard
whose tar and index are there and whose index says it holds what the plan
puts in it, aborts the multipart uploads a crash left behind, and writes
the rest. A manifest that does not describe the new plan is deleted first, so
no reader follows it to shards being rewritten.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from torchbucket import runtime
from torchbucket.errors import NotFoundError
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.shards._catalog import open_store
from torchbucket.shards._index import (
    INDEX_SUFFIX,
    MANIFEST_NAME,
    Manifest,
    ManifestShard,
)
from torchbucket.shards._names import check_member_names
from torchbucket.shards._pack_write import complete, write_shard
from torchbucket.shards._plan import PlannedShard, plan_shards
from torchbucket.shards._progress import Progress
from torchbucket.shards.config import PackConfig
from torchbucket.storage.base import ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["PackResult", "apack", "pack"]

logger = logging.getLogger(__name__)

_SHARD_RE = re.compile(r"^shard-(\d{6,})(\.tar|" + re.escape(INDEX_SUFFIX) + r")$")


@dataclass(frozen=True, slots=True)
class PackResult:
    """What a pack did (or, for a dry run, would do).

    Attributes:
        destination: URI of the destination prefix.
        shards: The plan, in order.
        kept: Numbers of the shards that were already complete.
        written: Numbers of the shards written by this call (none in a dry run).
        seconds: Wall time, listing included.
        dry_run: Whether nothing was written.
    """

    destination: str
    shards: tuple[PlannedShard, ...]
    kept: tuple[int, ...]
    written: tuple[int, ...]
    seconds: float
    dry_run: bool

    @property
    def samples(self) -> int:
        """Samples over all shards."""
        return sum(len(s.sample_starts) for s in self.shards)

    @property
    def objects(self) -> int:
        """Source objects over all shards."""
        return sum(len(s.members) for s in self.shards)

    @property
    def bytes(self) -> int:
        """Bytes of all the shards."""
        return sum(s.size for s in self.shards)

    def __repr__(self) -> str:
        # The plan holds every member's tar header: the generated repr of a
        # pack of 256 objects ran to half a MB. Counts, not the plan.
        return (
            f"PackResult(destination={self.destination!r}, shards={len(self.shards)}, "
            f"samples={self.samples}, objects={self.objects}, bytes={self.bytes}, "
            f"kept={self.kept!r}, written={self.written!r}, seconds={self.seconds:.2f}, "
            f"dry_run={self.dry_run!r})"
        )


def _folder(prefix: str) -> str:
    """A destination prefix as a folder (``out`` -> ``out/``)."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _member_base(prefix: str) -> str:
    """What is cut off source names: the prefix up to its last ``/``."""
    return prefix[: prefix.rfind("/") + 1]


async def apack(
    src: ObjectStore,
    src_prefix: str,
    dst: ObjectStore,
    dst_prefix: str,
    *,
    config: PackConfig | None = None,
    listing: ListingConfig | None = None,
    progress: bool | Literal["auto"] = "auto",
    dry_run: bool = False,
) -> PackResult:
    """Pack the objects under ``src_prefix`` into shards under ``dst_prefix``.

    Args:
        src: The source store.
        src_prefix: Objects whose names start with this; member names are
            their names after the prefix's last ``/``.
        dst: The destination store.
        dst_prefix: Where ``shard-000000.tar``, ``shard-000000.idx.json``...
            and ``manifest.json`` go (a ``/`` is added if missing).
        config: Shard size, grouping, concurrency; default ``PackConfig()``.
        listing: How the source is listed.
        progress: A bar of bytes packed on stderr: ``"auto"`` when stderr is a
            terminal, ``True`` always, ``False`` never.
        dry_run: Plan (and check which shards are complete), write nothing.

    Returns:
        The plan and what was kept and written.

    Raises:
        NotFoundError: Nothing is under the source prefix.
        ConfigError: With ``group_by="key"``, a name has no extension; or a
            member name is absolute or has a ``..``, ``.``, empty or NUL part
            (a tar extractor could write it outside its folder).
        StorageError: A read or write failed; complete shards stay, the one
            being written never becomes visible.
    """
    config = config or PackConfig()
    t0 = time.perf_counter()
    dst_prefix = _folder(dst_prefix)
    plan = await _plan(src, src_prefix, dst, dst_prefix, config, listing)
    present = await alist_objects(
        dst, dst_prefix, config=ListingConfig(progress=False, broadcast=False)
    )
    existing = {o.name: o for o in present}
    done = await gather_or_cancel(complete(dst, dst_prefix, s, existing) for s in plan)
    kept = tuple(s.number for s, entry in zip(plan, done) if entry is not None)
    if dry_run:
        return PackResult(
            dst.uri(dst_prefix), tuple(plan), kept, (), time.perf_counter() - t0, True
        )
    manifest_key = dst_prefix + MANIFEST_NAME
    source_uri = src.uri(src_prefix)
    if manifest_key in existing:
        await _drop_stale_manifest(dst, manifest_key, plan, whole=len(kept) == len(plan))
    await _abort_leftovers(dst, dst_prefix)
    bar = Progress(progress, sum(s.source_bytes for s in plan), f"packing {source_uri}")
    for number in kept:
        bar.update(plan[number].source_bytes)
    todo = [s for s, entry in zip(plan, done) if entry is None]
    entries = await _write_shards(src, dst, dst_prefix, todo, list(done), config, bar)
    await _delete_stale(dst, dst_prefix, existing, len(plan))
    manifest = Manifest(
        source=source_uri,
        group_by=config.group_by,
        shard_size=config.shard_size,
        shards=tuple(e for e in entries if e is not None),
    )
    await dst.put(manifest_key, manifest.to_json(), content_type="application/json")
    return PackResult(
        dst.uri(dst_prefix),
        tuple(plan),
        kept,
        tuple(s.number for s in todo),
        time.perf_counter() - t0,
        False,
    )


async def _write_shards(
    src: ObjectStore,
    dst: ObjectStore,
    dst_prefix: str,
    todo: list[PlannedShard],
    entries: list[ManifestShard | None],
    config: PackConfig,
    bar: Progress,
) -> list[ManifestShard | None]:
    """Write the shards ``todo``, ``config.shards_in_flight`` at a time, into ``entries``."""
    slots = asyncio.Semaphore(config.shards_in_flight)

    async def write(shard: PlannedShard) -> None:
        async with slots:
            entries[shard.number] = await write_shard(src, dst, dst_prefix, shard, config, bar)

    try:
        await gather_or_cancel(write(s) for s in todo)
    finally:
        bar.close()
    return entries


async def _plan(
    src: ObjectStore,
    src_prefix: str,
    dst: ObjectStore,
    dst_prefix: str,
    config: PackConfig,
    listing: ListingConfig | None,
) -> list[PlannedShard]:
    """List the source (less the destination, if it lies under it) and plan its shards."""
    objects = await alist_objects(src, src_prefix, config=listing)
    if dst.uri("") == src.uri(""):  # the destination may lie under the source
        objects = [o for o in objects if not o.name.startswith(dst_prefix)]
    if not objects:
        raise NotFoundError("no objects to pack", operation="pack", uri=src.uri(src_prefix))
    check_member_names(src, objects, _member_base(src_prefix))
    return plan_shards(
        objects, _member_base(src_prefix), shard_size=config.shard_size, group_by=config.group_by
    )


async def _drop_stale_manifest(
    dst: ObjectStore, manifest_key: str, plan: list[PlannedShard], *, whole: bool
) -> None:
    """Delete a manifest of another plan, or of this plan with shards still to write.

    It must not lead readers to shards being rewritten.
    """
    try:
        old = Manifest.from_json(await dst.get(manifest_key))
        stale = [s.fingerprint for s in old.shards] != [s.fingerprint for s in plan]
    except ValueError:
        stale = True
    if stale or not whole:
        await dst.delete(manifest_key)


async def _abort_leftovers(dst: ObjectStore, prefix: str) -> None:
    """Abort the multipart uploads of shards a crashed pack left behind."""
    for upload in await dst.multipart_list(prefix):
        if _SHARD_RE.match(upload.key[len(prefix) :]):
            logger.info("aborting a leftover upload of %s", dst.uri(upload.key))
            try:
                await dst.multipart_abort(upload.key, upload.upload_id)
            except NotFoundError:
                pass


async def _delete_stale(
    dst: ObjectStore, prefix: str, existing: dict[str, ObjectInfo], count: int
) -> None:
    """Delete shards (and indexes) numbered past the plan, from an earlier, larger pack."""
    stale = []
    for name in existing:
        match = _SHARD_RE.match(name[len(prefix) :])
        if match and int(match.group(1)) >= count:
            stale.append(name)
    for name in sorted(stale):
        logger.info("deleting %s: not part of this pack", dst.uri(name))
        try:
            await dst.delete(name)
        except NotFoundError:
            pass


def pack(
    src: str,
    dst: str,
    *,
    config: PackConfig | None = None,
    listing: ListingConfig | None = None,
    gcs: GCSConfig | None = None,
    progress: bool | Literal["auto"] = "auto",
    dry_run: bool = False,
) -> PackResult:
    """Pack the objects under the URI ``src`` into shards under the URI ``dst``.

    The synchronous form of :func:`apack`::

        from torchbucket.shards import PackConfig, pack

        pack("gs://bkt/raw/", "gs://bkt/packed/", config=PackConfig(shard_size=256 << 20))

    Args:
        src: ``gs://bucket/prefix``, ``memory://name/prefix`` or ``file:///dir/``.
        dst: The destination prefix URI.
        config: See :func:`apack`.
        listing: See :func:`apack`.
        gcs: How to reach GCS, for ``gs://`` URIs.
        progress: See :func:`apack`.
        dry_run: See :func:`apack`.

    Raises:
        See :func:`apack`.
    """
    src_store, src_prefix = open_store(src, gcs)
    dst_store, dst_prefix = open_store(dst, gcs)
    return runtime.run(
        apack(
            src_store,
            src_prefix,
            dst_store,
            dst_prefix,
            config=config,
            listing=listing,
            progress=progress,
            dry_run=dry_run,
        )
    )
