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
import collections
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from torchbucket import runtime
from torchbucket.errors import IntegrityError, NotFoundError
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.runtime.tasks import cancel_and_wait, gather_or_cancel
from torchbucket.shards._catalog import open_store
from torchbucket.shards._index import (
    INDEX_SUFFIX,
    MANIFEST_NAME,
    Manifest,
    ManifestShard,
    ShardIndex,
    index_name,
)
from torchbucket.shards._names import check_member_names
from torchbucket.shards._pack_stream import stream_shard
from torchbucket.shards._plan import PlannedMember, PlannedShard, plan_shards
from torchbucket.shards._progress import Progress
from torchbucket.shards._tar import END_OF_ARCHIVE, padding
from torchbucket.shards.config import PackConfig
from torchbucket.storage.base import ObjectInfo, ObjectStore, Part
from torchbucket.storage.capabilities import SupportsZonal
from torchbucket.storage.crc32c import Crc32c, extend

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = ["PackResult", "apack", "pack"]

logger = logging.getLogger(__name__)

_SHARD_RE = re.compile(r"^shard-(\d{6,})(\.tar|" + re.escape(INDEX_SUFFIX) + r")$")
_PARTS_IN_FLIGHT = 2


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


def _folder(prefix: str) -> str:
    """A destination prefix as a folder (``out`` -> ``out/``)."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _member_base(prefix: str) -> str:
    """What is cut off source names: the prefix up to its last ``/``."""
    return prefix[: prefix.rfind("/") + 1]


async def _read(store: ObjectStore, info: ObjectInfo) -> bytes:
    data = await store.get(info.name, generation=info.generation)
    if len(data) != info.size:
        raise IntegrityError(
            f"read {len(data)} bytes, listed with {info.size}: it changed during the pack",
            operation="pack read",
            uri=store.uri(info.name),
        )
    return data


async def _write_shard(
    src: ObjectStore,
    dst: ObjectStore,
    prefix: str,
    shard: PlannedShard,
    config: PackConfig,
    bar: Progress,
) -> ManifestShard:
    key = prefix + shard.name
    uri = dst.uri(key)
    if isinstance(dst, SupportsZonal) and await dst.zonal():
        # No multipart upload on a zonal bucket: one stream, checked as a whole.
        return await _indexed(
            dst, prefix, shard, *await stream_shard(src, dst, key, shard, config, bar, _read)
        )
    upload_id = await dst.multipart_initiate(key, content_type="application/x-tar")
    parts: dict[int, Part] = {}
    uploads: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(_PARTS_IN_FLIGHT)
    failure: list[BaseException] = []

    async def put_part(number: int, data: bytes) -> None:
        try:
            parts[number] = await dst.multipart_upload_part(key, upload_id, number, data)
        except Exception as exc:  # raised by the writer below, at its next part
            failure.append(exc)
        finally:
            slots.release()

    async def send(number: int, data: bytes) -> None:
        if failure:
            raise failure[0]
        await slots.acquire()
        task = asyncio.ensure_future(put_part(number, data))
        uploads.add(task)
        task.add_done_callback(uploads.discard)

    reads: collections.deque[asyncio.Task[bytes]] = collections.deque()
    pending = iter(shard.members)
    crcs: list[int] = []
    total = Crc32c()
    buffer = bytearray()
    number = 1
    try:
        for member in shard.members:
            while len(reads) < config.reads_in_flight:
                nxt: PlannedMember | None = next(pending, None)
                if nxt is None:
                    break
                reads.append(asyncio.ensure_future(_read(src, nxt.source)))
            data = await reads.popleft()
            crcs.append(extend(0, data))
            buffer += member.header
            buffer += data
            buffer += b"\0" * padding(len(data))
            bar.update(len(data))
            del data
            if len(buffer) >= config.part_size:
                chunk = bytes(buffer)
                buffer.clear()
                total.update(chunk)
                await send(number, chunk)
                number += 1
        buffer += END_OF_ARCHIVE
        chunk = bytes(buffer)
        buffer.clear()
        total.update(chunk)
        await send(number, chunk)
        if uploads:
            await asyncio.gather(*list(uploads))
        if failure:
            raise failure[0]
        info = await dst.multipart_complete(key, upload_id, [parts[n] for n in sorted(parts)])
    except BaseException:
        await cancel_and_wait([*reads, *uploads])
        try:
            await asyncio.shield(dst.multipart_abort(key, upload_id))
        except Exception:  # the upload may already be gone; nothing was made visible
            logger.debug("aborting the upload of %s failed", uri, exc_info=True)
        raise
    return await _indexed(dst, prefix, shard, info, crcs, total)


async def _indexed(
    dst: ObjectStore,
    prefix: str,
    shard: PlannedShard,
    info: ObjectInfo,
    crcs: list[int],
    total: Crc32c,
) -> ManifestShard:
    """Check the shard written against the plan, then write its index."""
    uri = dst.uri(prefix + shard.name)
    key = prefix + shard.name
    if info.size != shard.size or (info.crc32c is not None and info.crc32c != total.b64()):
        await dst.delete(key)
        raise IntegrityError(
            f"the shard written is {info.size} bytes (CRC32C {info.crc32c}), the plan says "
            f"{shard.size} bytes (CRC32C {total.b64()}); deleted it",
            operation="pack",
            uri=uri,
        )
    index = ShardIndex(
        [m.name for m in shard.members],
        [m.data_offset for m in shard.members],
        [m.source.size for m in shard.members],
        crcs,
        shard.sample_starts,
        size=shard.size,
        fingerprint=shard.fingerprint,
        shard_crc32c=total.b64(),
    )
    await dst.put(
        prefix + index_name(shard.name), index.to_json(shard.name), content_type="application/json"
    )
    logger.info("packed %s: %d members, %d bytes", uri, len(shard.members), shard.size)
    return _manifest_entry(shard, total.b64())


def _manifest_entry(shard: PlannedShard, crc32c: str) -> ManifestShard:
    return ManifestShard(
        name=shard.name,
        size=shard.size,
        crc32c=crc32c,
        samples=len(shard.sample_starts),
        members=len(shard.members),
        fingerprint=shard.fingerprint,
    )


async def _complete(
    dst: ObjectStore, prefix: str, shard: PlannedShard, existing: dict[str, ObjectInfo]
) -> ManifestShard | None:
    """The manifest entry of a shard already written by the same plan, else ``None``."""
    tar = existing.get(prefix + shard.name)
    idx_key = prefix + index_name(shard.name)
    if tar is None or idx_key not in existing or tar.size != shard.size:
        return None
    try:
        index = ShardIndex.from_json(await dst.get(idx_key))
    except (NotFoundError, ValueError):
        return None
    if index.fingerprint != shard.fingerprint or index.size != shard.size:
        return None
    return _manifest_entry(shard, index.shard_crc32c or tar.crc32c or "")


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
    objects = await alist_objects(src, src_prefix, config=listing)
    if dst.uri("") == src.uri(""):  # the destination may lie under the source
        objects = [o for o in objects if not o.name.startswith(dst_prefix)]
    if not objects:
        raise NotFoundError("no objects to pack", operation="pack", uri=src.uri(src_prefix))
    check_member_names(src, objects, _member_base(src_prefix))
    plan = plan_shards(
        objects, _member_base(src_prefix), shard_size=config.shard_size, group_by=config.group_by
    )
    present = await alist_objects(
        dst, dst_prefix, config=ListingConfig(progress=False, broadcast=False)
    )
    existing = {o.name: o for o in present}
    done = await gather_or_cancel(_complete(dst, dst_prefix, s, existing) for s in plan)
    kept = tuple(s.number for s, entry in zip(plan, done) if entry is not None)
    if dry_run:
        return PackResult(
            dst.uri(dst_prefix), tuple(plan), kept, (), time.perf_counter() - t0, True
        )
    manifest_key = dst_prefix + MANIFEST_NAME
    source_uri = src.uri(src_prefix)
    if manifest_key in existing:
        # A manifest of another plan must not lead readers to shards being rewritten.
        try:
            old = Manifest.from_json(await dst.get(manifest_key))
            stale = [s.fingerprint for s in old.shards] != [s.fingerprint for s in plan]
        except ValueError:
            stale = True
        if stale or len(kept) != len(plan):
            await dst.delete(manifest_key)
    await _abort_leftovers(dst, dst_prefix)
    bar = Progress(progress, sum(s.source_bytes for s in plan), f"packing {source_uri}")
    entries: list[ManifestShard | None] = list(done)
    for number in kept:
        bar.update(plan[number].source_bytes)
    todo = [s for s, entry in zip(plan, done) if entry is None]
    slots = asyncio.Semaphore(config.shards_in_flight)

    async def write(shard: PlannedShard) -> None:
        async with slots:
            entries[shard.number] = await _write_shard(src, dst, dst_prefix, shard, config, bar)

    try:
        await gather_or_cancel(write(s) for s in todo)
    finally:
        bar.close()
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
