"""``torchbucket cp``: put a local folder into a bucket, or a prefix into a folder.

Each side is a local path or a bucket prefix; objects are copied many at a time
on the background loop. Files at or above the streaming threshold go through
the store's streaming read and upload, so memory stays bounded by
``jobs x threshold``. A local file appears only when complete (written to a
temporary name, then renamed), as an object does.

Reads follow the one rule of every read path: a checksum mismatch is retried
like a transient error, and only a mismatch that persists reaches the user, as
:class:`~torchbucket.errors.IntegrityError`. A whole read is retried by the
store; a streamed one can only be checked at its end, so the copy is read again
from the start (nothing of the failed attempt is visible), with the store's
backoff and deadline.

The local side (:mod:`._cp_local`) lists a folder by one policy for special
files and symlinks, and checks every download path before anything is written.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import mimetypes
import os
import posixpath
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from torchbucket import runtime
from torchbucket.cli._common import (
    EXIT_NOT_FOUND,
    CommandError,
    Target,
    human_bytes,
    is_remote,
    local_path,
    open_target,
    parse_size,
    plural,
    positive_int,
    progress_bar,
)
from torchbucket.cli._cp_local import (
    Local,
    LocalOptions,
    SymlinkPolicy,
    local_error,
    regular_file_size,
)
from torchbucket.config import RetryConfig
from torchbucket.errors import IntegrityError, NotFoundError, TorchBucketError
from torchbucket.listing import alist_objects
from torchbucket.runtime import retry
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage import RemoteStore

__all__ = ["CopyStats", "add_cp", "copy"]

logger = logging.getLogger(__name__)

_CHUNK = 8 << 20


@dataclass(frozen=True, slots=True)
class CopyStats:
    """What a copy moved.

    Attributes:
        objects: Files or objects copied.
        bytes: Their total size.
        seconds: Wall time of the copy, listing included.
    """

    objects: int
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        """Throughput in decimal megabytes per second."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


class _Remote:
    """A prefix (or one object) in a store."""

    def __init__(self, target: Target, prefix: str) -> None:
        self.target = target
        self.prefix = prefix

    def __str__(self) -> str:
        return self.target.uri_of(self.prefix)

    def key(self, rel: str) -> str:
        return self.prefix + rel

    def describe(self, rel: str) -> str:
        return self.target.uri_of(self.key(rel))

    async def items(self) -> list[tuple[str, int]]:
        objects = await alist_objects(self.target.store, self.prefix)
        return [(o.name[len(self.prefix) :], o.size) for o in objects]

    async def read(self, rel: str) -> bytes:
        return await self.target.store.get(self.key(rel))

    def stream(self, rel: str) -> AsyncIterator[bytes]:
        return self.target.store.stream(self.key(rel), chunk_size=_CHUNK)

    async def write(self, rel: str, data: bytes) -> None:
        await self.target.store.put(self.key(rel), data, content_type=_content_type(rel))

    async def write_stream(self, rel: str, chunks: AsyncIterator[bytes]) -> None:
        await self.target.store.put_stream(self.key(rel), chunks, content_type=_content_type(rel))

    async def close(self) -> None:
        await self.target.store.close()


_Side = Local | _Remote


def _content_type(name: str) -> str | None:
    return mimetypes.guess_type(name)[0]


@dataclass(frozen=True, slots=True)
class _Item:
    src: str  # name relative to the source folder or prefix
    dst: str  # name relative to the destination folder or prefix
    size: int


def _parent(key: str) -> str:
    """``"a/b/c.png"`` -> ``"a/b/"``; ``"c.png"`` -> ``""``."""
    head, sep, _ = key.rpartition("/")
    return head + sep


async def _source(
    text: str, endpoint: str | None, options: LocalOptions
) -> tuple[_Side, tuple[str, int] | None]:
    """The source side, and ``(name, size)`` when it names one file or object."""
    if not is_remote(text):
        path = local_path(text)
        size = await asyncio.to_thread(regular_file_size, path)
        if size is None:
            return Local(path, options), None
        return Local(os.path.dirname(path), options), (os.path.basename(path), size)
    target = open_target(text, endpoint)
    key = target.key
    if key and not key.endswith("/"):
        try:
            info = await target.store.head(key)
        except NotFoundError:
            return _Remote(target, key + "/"), None
        return _Remote(target, _parent(key)), (posixpath.basename(key), info.size)
    return _Remote(target, key), None


def _nothing_to_copy(src_text: str, src: _Side) -> CommandError:
    """The error for an empty source, naming what the user typed."""
    if isinstance(src, _Remote) and not src_text.endswith("/") and src.prefix:
        what = f"no object {src.target.uri_of(src.prefix[:-1])} and no objects under {src}"
    elif isinstance(src, _Remote):
        what = f"no objects under {src}"
    else:
        what = f"no files to copy under {src}"
    return CommandError(f"nothing to copy: {what}", exit_code=EXIT_NOT_FOUND)


async def _resolve(
    src_text: str, dst_text: str, endpoint: str | None, options: LocalOptions
) -> tuple[_Side, _Side, list[_Item]]:
    """The two sides and what to copy: one file/object, or all under a folder/prefix.

    A source that names one file (or one object: a key without a trailing ``/``
    that exists) is copied alone; anything else is a folder (prefix) whose
    contents are copied under the destination.
    """
    src, single = await _source(src_text, endpoint, options)

    # A single source copied to a name that is not a folder takes that name.
    dst: _Side
    rename: str | None = None
    if is_remote(dst_text):
        target = open_target(dst_text, endpoint)
        key = target.key
        if single is not None and key and not key.endswith("/"):
            dst, rename = _Remote(target, _parent(key)), posixpath.basename(key)
        else:
            dst = _Remote(target, key if not key or key.endswith("/") else key + "/")
    else:
        path = local_path(dst_text)
        is_dir = await asyncio.to_thread(os.path.isdir, path)
        if single is not None and not dst_text.endswith("/") and not is_dir:
            dst, rename = Local(os.path.dirname(path)), os.path.basename(path)
        else:
            dst = Local(path)

    if single is not None:
        return src, dst, [_Item(single[0], rename or single[0], single[1])]
    items = [_Item(rel, rel, size) for rel, size in await src.items()]
    if not items:
        raise _nothing_to_copy(src_text, src)
    return src, dst, items


async def _stream_copy(src: _Side, dst: _Side, item: _Item) -> None:
    """Stream one object or file; a source stream that fails its checksum is read again.

    Raises:
        IntegrityError: The object's bytes failed their checksum on every read
            until the store's retry deadline (or attempt cap).
    """
    if not isinstance(src, _Remote):
        await dst.write_stream(item.dst, src.stream(item.src))
        return
    store = src.target.store
    config = store.retry if isinstance(store, RemoteStore) else RetryConfig()
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            # A failed attempt leaves nothing: the local file is renamed into
            # place, and an upload completes, only after the whole stream.
            await dst.write_stream(item.dst, src.stream(item.src))
            return
        except IntegrityError as exc:
            attempt += 1
            delay = retry.backoff_delay(attempt - 1, config)
            elapsed = time.monotonic() - started
            out_of_attempts = config.max_attempts is not None and attempt >= config.max_attempts
            if out_of_attempts or elapsed + delay >= config.deadline:
                raise IntegrityError(
                    f"gave up after {attempt} reads ({elapsed:.1f} s); last error: {exc.message}",
                    operation="cp",
                    uri=src.describe(item.src),
                    status=exc.status,
                ) from exc
            logger.warning(
                "cp %s: %s; reading it again in %.2f s", src.describe(item.src), exc.message, delay
            )
            await asyncio.sleep(delay)


async def _close(*sides: _Side) -> None:
    await asyncio.gather(*(side.close() for side in sides), return_exceptions=True)


async def _copy_all(
    src: _Side, dst: _Side, items: list[_Item], *, jobs: int, stream_threshold: int, bar: tqdm[Any]
) -> None:
    gate = asyncio.Semaphore(jobs)

    async def one(item: _Item) -> None:
        async with gate:
            try:
                if item.size >= stream_threshold:
                    await _stream_copy(src, dst, item)
                else:
                    await dst.write(item.dst, await src.read(item.src))
            except OSError as exc:  # a local read or write: say which file and object
                if isinstance(exc, TorchBucketError):
                    raise
                raise local_error(exc, src.describe(item.src), dst.describe(item.dst)) from exc
        bar.update(item.size)

    try:
        await gather_or_cancel(one(item) for item in items)
    finally:
        await _close(src, dst)


def copy(
    src: str,
    dst: str,
    *,
    endpoint: str | None = None,
    jobs: int = 64,
    stream_threshold: int = 32 << 20,
    desc: str = "copying",
    symlinks: SymlinkPolicy = "files",
    strict: bool = False,
) -> CopyStats:
    """Copy a file, folder, object or prefix to a folder or prefix.

    Args:
        src: Local path or URI to copy from.
        dst: Local path or URI to copy to.
        endpoint: The GCS endpoint for ``gs://`` URIs; ``None`` for the default.
        jobs: Objects copied at once.
        stream_threshold: Objects at least this big are streamed.
        desc: The progress bar's label.
        symlinks: For a local source: ``"files"`` copies what symlinks to files
            point to and skips symlinked folders with a warning; ``"all"``
            follows both; ``"none"`` skips every symlink.
        strict: Refuse, rather than skip with a warning, FIFOs, sockets,
            devices, broken symlinks and (with ``"files"``) symlinked folders.

    Returns:
        What was copied and how long it took.

    Raises:
        CommandError: Nothing to copy; a name that would escape the destination,
            two objects for one local path, a symlink in the destination that
            leads outside it (all before anything is written); a local file
            that could not be read or written (naming it and the object).
        StorageError: A read or write failed.
    """
    started = time.perf_counter()
    options = LocalOptions(symlinks=symlinks, strict=strict)
    source, dest, items = runtime.run(_resolve(src, dst, endpoint, options))
    if isinstance(dest, Local):
        try:
            dest.check_targets((item.dst, source.describe(item.src)) for item in items)
        except BaseException:
            runtime.run(_close(source, dest))
            raise
    total = sum(item.size for item in items)
    with progress_bar(desc=desc, total=total, unit="B", unit_scale=True, unit_divisor=1024) as bar:
        runtime.run(
            _copy_all(source, dest, items, jobs=jobs, stream_threshold=stream_threshold, bar=bar)
        )
    return CopyStats(objects=len(items), bytes=total, seconds=time.perf_counter() - started)


def add_cp(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``torchbucket cp``."""
    parser = sub.add_parser(
        "cp",
        parents=[common],
        help="copy a local folder to a bucket prefix, or a prefix to a local folder",
        description=(
            "Copy SRC to DST, many objects at a time. SRC and DST are each a local path "
            "(or file:///path) or a bucket URI (gs://bucket/prefix/). A folder or prefix is "
            "copied by its contents: SRC/a/b.png lands at DST/a/b.png. A single file or "
            "object is copied to DST/<its name> when DST ends with '/' or is an existing "
            "local folder, else to DST itself. Local files appear only when complete. "
            "Prints one line at the end: objects, bytes, seconds and MB/s; a progress bar "
            "shows on a terminal. Nothing to copy is an error (exit 3). Uploads copy "
            "regular files; FIFOs, sockets and devices are skipped with a warning each "
            "(--strict refuses them), and symlinks follow the policy below. Downloads "
            "check every path before writing anything: a name that would leave DST "
            "('..', absolute), two objects for one path ('a//b' and 'a/b', or 'a' beside "
            "'a/b') and a symlink in DST that leads outside it are refused, naming the "
            "objects. Ctrl-C stops the copy (exit 130); a file being written never appears."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket cp ./images gs://my-bucket/train/     # upload a folder\n"
            "  torchbucket cp gs://my-bucket/train/ ./images     # download a prefix\n"
            "  torchbucket cp model.pt gs://my-bucket/ckpt/      # one file"
        ),
    )
    parser.add_argument("src", metavar="SRC", help="local path or URI to copy from")
    parser.add_argument("dst", metavar="DST", help="local path or URI to copy to")
    parser.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=64,
        help="objects copied at once (default: 64)",
    )
    parser.add_argument(
        "--stream-threshold",
        type=parse_size,
        default=32 << 20,
        metavar="SIZE",
        help="stream objects at least this big instead of holding them in memory (default: 32MiB)",
    )
    links = parser.add_mutually_exclusive_group()
    links.add_argument(
        "--follow-symlinks",
        dest="symlinks",
        action="store_const",
        const="all",
        default="files",
        help="uploads: also copy the contents of symlinked folders (each real folder once). "
        "Default: a symlink to a file is copied as that file (as gcloud storage cp does), "
        "a symlink to a folder or a broken one is skipped with a warning",
    )
    links.add_argument(
        "--ignore-symlinks",
        dest="symlinks",
        action="store_const",
        const="none",
        help="uploads: skip every symlink, to a file or a folder",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="uploads: refuse (exit 1, nothing copied) what would be skipped with a "
        "warning: FIFOs, sockets, devices, broken symlinks, symlinked folders",
    )
    parser.set_defaults(func=_cp)


def _cp(args: argparse.Namespace) -> int:
    stats = copy(
        args.src,
        args.dst,
        endpoint=args.endpoint,
        jobs=args.jobs,
        stream_threshold=args.stream_threshold,
        symlinks=args.symlinks,
        strict=args.strict,
    )
    print(
        f"copied {plural(stats.objects, 'object')}, {stats.bytes} bytes ({human_bytes(stats.bytes)}) "
        f"in {stats.seconds:.2f} s, {stats.mb_per_s:.1f} MB/s"
    )
    return 0
