"""``torchbucket rm``: delete an object, or everything under a prefix with ``-r``.

As ``gsutil rm`` / ``gcloud storage rm``: ``rm gs://b/obj`` deletes one object;
``rm -r gs://b/prefix/`` lists the prefix and deletes every object under it,
after a confirmation on a terminal, or with ``--yes``. Without a terminal and
without ``--yes`` a prefix is refused (exit 2) before anything is deleted: a
script that meant one object never empties a bucket.
"""

from __future__ import annotations

import argparse
import sys

from torchbucket import runtime
from torchbucket.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CommandError,
    Target,
    human_bytes,
    open_target,
    plural,
    progress_bar,
)
from torchbucket.cli._ls import list_target
from torchbucket.errors import NotFoundError, StorageError
from torchbucket.listing import ListingConfig
from torchbucket.runtime.tasks import gather_or_cancel
from torchbucket.storage import ObjectInfo

__all__ = ["add_rm"]

_IN_FLIGHT = 64


def add_rm(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    parser = sub.add_parser(
        "rm",
        parents=[common],
        help="delete objects (-r: everything under a prefix)",
        description=(
            "Delete the objects named. With -r, a URI is a prefix: every object whose name "
            "starts with it is listed and deleted (gs://b/dir deletes the object dir, if any, "
            "and everything under dir/). Deleting a prefix asks for confirmation when stdin "
            "is a terminal; elsewhere it needs --yes, and without it nothing is deleted "
            "(exit 2). An object that does not exist, or a prefix with nothing under it, is "
            "an error (exit 3)."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket rm gs://my-bucket/run-7/last.ckpt\n"
            "  torchbucket rm -r gs://my-bucket/run-7/\n"
            "  torchbucket rm -r --yes gs://my-bucket/tmp/    # no question asked (scripts)"
        ),
    )
    parser.add_argument(
        "uris", nargs="+", metavar="URI", help="gs://bucket/object (or a prefix with -r)"
    )
    parser.add_argument(
        "-r",
        "--recursive",
        action="store_true",
        help="delete everything under each URI taken as a prefix",
    )
    parser.add_argument(
        "-y", "--yes", action="store_true", help="delete a prefix without asking for confirmation"
    )
    parser.set_defaults(func=_rm)


def _rm(args: argparse.Namespace) -> int:
    targets = [open_target(uri, args.endpoint) for uri in args.uris]
    if not args.recursive:
        for target in targets:
            if not target.key or target.key.endswith("/"):
                raise CommandError(
                    f"{target.uri} is a prefix: use rm -r to delete everything under it",
                    exit_code=EXIT_USAGE,
                )
        for target in targets:
            _remove_one(target)
        return 0
    for target in targets:
        _remove_prefix(target, yes=args.yes)
    return 0


def _remove_one(target: Target) -> None:
    try:
        runtime.run(target.store.delete(target.key))
    finally:
        runtime.run(target.store.close())
    print(f"removed {target.uri}")


def _under(target: Target) -> list[ObjectInfo]:
    """The objects ``rm -r`` deletes: under the prefix, as a folder when it has no ``/``.

    Everything there goes, as with ``gcloud storage rm -r``: folder placeholders
    and torchbucket's staging objects too, which a dataset's listing leaves out.
    """
    everything = ListingConfig(include_folders=True, include_hidden=True)
    objects, _ = list_target(target, what="finding", config=everything)
    key = target.key
    if not key or key.endswith("/"):
        return objects
    return [o for o in objects if o.name == key or o.name.startswith(key + "/")]


def _remove_prefix(target: Target, *, yes: bool) -> None:
    objects = _under(target)
    if not objects:
        raise CommandError(f"no objects match {target.uri}", exit_code=EXIT_NOT_FOUND)
    total = sum(o.size for o in objects)
    what = f"{plural(len(objects), 'object')} ({human_bytes(total)}) under {target.uri}"
    if not yes:
        _confirm(what)
    deleted, gone = _delete_all(target, objects)
    line = f"removed {plural(deleted, 'object')} under {target.uri}"
    if gone:
        line += f"; {plural(gone, 'object')} had gone or changed since the listing (kept)"
    print(line)


def _confirm(what: str) -> None:
    try:
        interactive = sys.stdin.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        raise CommandError(
            f"refusing to delete {what} without confirmation: pass --yes (-y) to delete "
            "without a terminal",
            exit_code=EXIT_USAGE,
        )
    sys.stderr.write(f"delete {what}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("nothing deleted", exit_code=EXIT_USAGE)


def _delete_all(target: Target, objects: list[ObjectInfo]) -> tuple[int, int]:
    """Delete each object pinned to the generation listed; (deleted, gone or changed)."""
    bar = progress_bar(desc=f"removing {target.uri}", total=len(objects), unit=" objects")
    store = target.store

    async def delete_all() -> tuple[int, int]:
        pending = iter(objects)
        counts = [0, 0]
        failures: list[StorageError] = []

        async def worker() -> None:
            for obj in pending:
                if failures:
                    return
                try:
                    # Pinned: retried on transient failures, and an object
                    # rewritten since the listing is not deleted unseen.
                    await store.delete(obj.name, generation=obj.generation)
                    counts[0] += 1
                except NotFoundError:
                    counts[1] += 1
                except StorageError as exc:
                    failures.append(exc)
                    return
                bar.update(1)

        await gather_or_cancel(worker() for _ in range(min(_IN_FLIGHT, len(objects))))
        if failures:
            raise failures[0]
        return counts[0], counts[1]

    try:
        with bar:
            return runtime.run(delete_all())
    finally:
        runtime.run(store.close())
