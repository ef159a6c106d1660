"""``torchbucket cat``: an object's bytes on stdout, as ``gsutil cat`` (``-r`` for a range)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import BinaryIO

from torchbucket import runtime
from torchbucket.cli._common import EXIT_USAGE, CommandError, Target, open_target

__all__ = ["add_cat", "parse_range"]

_RANGE_RE = re.compile(r"^(\d*)-(\d*)$")


def parse_range(text: str) -> tuple[int | None, int | None]:
    """gsutil's ``-r``: ``START-END`` (END included), ``START-``, or ``-N`` (the last N bytes).

    Returns:
        ``(start, end)`` with ``end`` one past the last byte (``None``: the
        object's end), or ``(None, n)`` for the last ``n`` bytes.

    Raises:
        argparse.ArgumentTypeError: Not a range.
    """
    match = _RANGE_RE.match(text.strip())
    if match is None or match.group(0) == "-":
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte range (START-END, START- or -N; END included)"
        )
    first, last = match.groups()
    if not first:
        return None, int(last)
    start = int(first)
    if not last:
        return start, None
    if int(last) < start:
        raise argparse.ArgumentTypeError(f"{text!r}: the range ends before it starts")
    return start, int(last) + 1


def add_cat(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    parser = sub.add_parser(
        "cat",
        parents=[common],
        help="write objects' bytes to stdout",
        description=(
            "Write each object's bytes to stdout, one after the other, as they arrive. "
            "A missing object is an error (exit 3)."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket cat gs://my-bucket/train/labels.csv\n"
            "  torchbucket cat -r 0-1023 gs://my-bucket/packed/shard-00000.tar | xxd | head\n"
            "  torchbucket cat -r -100 gs://my-bucket/logs/run-7.txt    # the last 100 bytes"
        ),
    )
    parser.add_argument("uris", nargs="+", metavar="URI", help="gs://bucket/object")
    parser.add_argument(
        "-r",
        "--range",
        type=parse_range,
        metavar="RANGE",
        help="only these bytes: START-END (END included), START- (to the end) or -N (last N)",
    )
    parser.set_defaults(func=_cat)


def _cat(args: argparse.Namespace) -> int:
    targets = [open_target(uri, args.endpoint) for uri in args.uris]
    for target in targets:
        if not target.key or target.key.endswith("/"):
            raise CommandError(
                f"{target.uri} is a prefix; cat reads objects (see: torchbucket ls)",
                exit_code=EXIT_USAGE,
            )
    out = sys.stdout.buffer
    try:
        for target in targets:
            _write(target, args.range, out)
        out.flush()
    except BrokenPipeError:
        # The reader stopped (`| head`): not an error. Stdout goes to devnull so
        # that the interpreter's own flush at exit does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _write(target: Target, span: tuple[int | None, int | None] | None, out: BinaryIO) -> None:
    store = target.store

    async def copy() -> None:
        start, end = span if span is not None else (0, None)
        if start is None:  # the last `end` bytes
            size = (await store.head(target.key)).size
            start, end = max(0, size - (end or 0)), None
        async for chunk in store.stream(target.key, start=start, end=end):
            out.write(chunk)

    try:
        runtime.run(copy())
    finally:
        runtime.run(store.close())
