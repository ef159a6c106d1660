"""``torchbucket ls`` and ``torchbucket du``: what is under a prefix, and how big."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tqdm import tqdm

from torchbucket import runtime
from torchbucket.cli._common import (
    EXIT_NOT_FOUND,
    CommandError,
    Target,
    human_bytes,
    open_target,
    plural,
    progress_bar,
)
from torchbucket.listing import ListingConfig, alist_objects
from torchbucket.storage import ObjectInfo

__all__ = ["add_du", "add_ls", "list_target"]


class _Updates:
    """Hands the listing only ``update(n)``: ``tqdm`` itself does not compare with strings."""

    def __init__(self, bar: tqdm[Any]) -> None:
        self._bar = bar

    def update(self, n: int) -> None:
        self._bar.update(n)


def list_target(
    target: Target, *, what: str = "listing", config: ListingConfig | None = None
) -> tuple[list[ObjectInfo], float]:
    """Every object under the target's prefix, with a progress bar on a terminal.

    ``config`` says what the listing keeps (default: what a dataset would read).

    Returns:
        The objects (sorted by name) and the seconds the listing took.
    """
    bar = progress_bar(desc=f"{what} {target.uri}", unit=" objects")
    started = time.perf_counter()
    try:
        with bar:
            objects = runtime.run(
                alist_objects(target.store, target.key, config=config, progress=_Updates(bar))
            )
    finally:
        runtime.run(target.store.close())
    return objects, time.perf_counter() - started


def _nothing_matched(target: Target) -> CommandError:
    hint = "; wildcards are not expanded" if any(c in str(target.uri) for c in "*?") else ""
    return CommandError(f"no objects match {target.uri}{hint}", exit_code=EXIT_NOT_FOUND)


def add_ls(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    parser = sub.add_parser(
        "ls",
        parents=[common],
        help="list the objects under a prefix",
        description=(
            "List every object whose name starts with URI's key (recursively: there are no "
            "directories in a bucket), sorted by name, in parallel over key ranges. Composed "
            "objects that torchbucket writes under dataflux-composed-objects/ and folder "
            "placeholders (names ending in '/') are not shown. A progress bar counts objects "
            "found when stderr is a terminal. Nothing under the prefix is an error (exit 3)."
        ),
        epilog="examples:\n  torchbucket ls gs://my-bucket/train/\n  torchbucket ls -l gs://my-bucket/train/img_00\n"
        "  torchbucket ls -H gs://my-bucket/train/    # sizes in KiB/MiB/GiB, and a total",
    )
    parser.add_argument("uri", metavar="URI", help="gs://bucket/prefix (or memory://, file:///)")
    parser.add_argument(
        "-l",
        "--long",
        action="store_true",
        help="show each object's size in bytes, and a total line",
    )
    parser.add_argument(
        "-H",
        "--human-readable",
        action="store_true",
        help="sizes in KiB/MiB/GiB instead of bytes (implies -l)",
    )
    parser.set_defaults(func=_ls)


def _ls(args: argparse.Namespace) -> int:
    target = open_target(args.uri, args.endpoint)
    objects, _ = list_target(target)
    if not objects:
        raise _nothing_matched(target)
    lines = []
    if args.long or args.human_readable:
        for obj in objects:
            size = human_bytes(obj.size) if args.human_readable else str(obj.size)
            lines.append(f"{size:>12}  {target.uri_of(obj.name)}")
        total = sum(o.size for o in objects)
        lines.append(
            f"TOTAL: {plural(len(objects), 'object')}, {total} bytes ({human_bytes(total)})"
        )
    else:
        lines.extend(target.uri_of(obj.name) for obj in objects)
    print("\n".join(lines))
    return 0


def add_du(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    parser = sub.add_parser(
        "du",
        parents=[common],
        help="count the objects and bytes under a prefix",
        description=(
            "Count the objects and bytes under URI's prefix. Without -s, one line per "
            "first-level 'folder' (the next '/'-separated part of the name) and a total "
            "line; objects directly under the prefix are counted in the total only. "
            "Nothing under the prefix is an error (exit 3)."
        ),
        epilog="example:\n  torchbucket du gs://my-bucket/datasets/",
    )
    parser.add_argument("uri", metavar="URI", help="gs://bucket/prefix (or memory://, file:///)")
    parser.add_argument("-s", "--summarize", action="store_true", help="print the total line only")
    parser.set_defaults(func=_du)


def _du(args: argparse.Namespace) -> int:
    target = open_target(args.uri, args.endpoint)
    objects, _ = list_target(target, what="counting")
    if not objects:
        raise _nothing_matched(target)
    rows: list[tuple[int, int, str]] = []
    if not args.summarize:
        groups: dict[str, list[int]] = {}
        for obj in objects:
            rest = obj.name[len(target.key) :]
            head, sep, _ = rest.partition("/")
            if sep:
                group = groups.setdefault(target.key + head + "/", [0, 0])
                group[0] += 1
                group[1] += obj.size
        rows.extend((n, size, target.uri_of(key)) for key, (n, size) in groups.items())
    total = sum(o.size for o in objects)
    rows.append((len(objects), total, str(target.uri)))
    for count, size, uri in rows:
        print(f"{count:>10} objects  {size:>15} bytes  {human_bytes(size):>10}  {uri}")
    return 0
