"""``torchbucket pack``: pack the objects under a prefix into tar shards."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchbucket import runtime
from torchbucket.cli._common import open_target, parse_size, positive_int

if TYPE_CHECKING:
    from torchbucket.shards import PackResult

__all__ = ["add_pack"]


def _describe(result: PackResult) -> Sequence[str]:
    """Lines that tell what a pack did or would do."""
    verb = "would write" if result.dry_run else "wrote"
    todo = [s for s in result.shards if s.number not in result.kept]
    lines = [
        f"{result.destination}: {len(result.shards)} shards, {result.samples} samples from "
        f"{result.objects} objects, {result.bytes} bytes; {len(result.kept)} already complete, "
        f"{verb} {len(todo)}"
    ]
    for s in result.shards:
        state = "complete" if s.number in result.kept else verb
        lines.append(
            f"  {s.name}  {len(s.sample_starts)} samples  {len(s.members)} members  "
            f"{s.size} bytes  ({state})"
        )
    return lines


def _pack(args: argparse.Namespace) -> int:
    from torchbucket.shards import PackConfig, apack

    src = open_target(args.src)
    dst = open_target(args.dst)
    config = PackConfig(
        shard_size=args.shard_size,
        group_by=args.group_by,
        reads_in_flight=args.jobs,
        shards_in_flight=args.shards_in_flight,
    )
    result = runtime.run(
        apack(src.store, src.key, dst.store, dst.key, config=config, dry_run=args.dry_run)
    )
    lines = _describe(result)
    if args.dry_run:
        for line in lines:
            print(line)
    else:
        print(f"{lines[0]} in {result.seconds:.1f} s")
    return 0


def add_pack(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``torchbucket pack``."""
    parser = sub.add_parser(
        "pack",
        parents=[common],
        help="pack the objects under a prefix into tar shards (WebDataset layout)",
        description=(
            "Read every object under SRC_PREFIX (listed in parallel, many reads in flight) "
            "and write tar shards shard-000000.tar, shard-000001.tar... under DST_PREFIX, "
            "each with an index (shard-000000.idx.json: member names, offsets, sizes, "
            "CRC32Cs), and a manifest.json for the set. Members are named by the objects' "
            "names under SRC_PREFIX; with --group-by key the objects <key>.<ext> of one key "
            "are one sample, kept together. The same input gives the same shards. Run it "
            "again after a crash: complete shards are kept, a shard being written never "
            "becomes visible. Read the result with torchbucket.shards.BucketShardDataset. "
            "A member name that is absolute or has a '..', '.', empty ('a//b') or NUL part "
            "is refused, naming its object, before anything is written (exit 2): a tar "
            "extractor could write it outside its folder."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket pack gs://bkt/raw/ gs://bkt/packed/\n"
            "  torchbucket pack gs://bkt/raw/ gs://bkt/packed/ --shard-size 1GiB --dry-run"
        ),
    )
    parser.add_argument("src", metavar="SRC_PREFIX", help="URI of the objects to pack")
    parser.add_argument("dst", metavar="DST_PREFIX", help="URI of the prefix to write shards to")
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        default=256 << 20,
        metavar="SIZE",
        help="target bytes per shard (default: 256MiB)",
    )
    parser.add_argument(
        "--group-by",
        choices=("key", "none"),
        default="key",
        help="key: the objects <key>.<ext> of one key form a sample; none: one object "
        "per sample (default: key)",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=64,
        help="reads in flight per shard (default: 64)",
    )
    parser.add_argument(
        "--shards-in-flight",
        type=positive_int,
        default=4,
        help="shards written at once (default: 4)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (and what is complete), write nothing",
    )
    parser.set_defaults(func=_pack)
