"""``torchbucket mb``: make a bucket, as ``gsutil mb`` / ``gcloud storage buckets create``."""

from __future__ import annotations

import argparse

from torchbucket import runtime
from torchbucket.cli._common import EXIT_USAGE, CommandError, open_target
from torchbucket.storage import SupportsBuckets

__all__ = ["add_mb"]


def add_mb(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    parser = sub.add_parser(
        "mb",
        parents=[common],
        help="make a bucket",
        description=(
            "Create each bucket named. On the local emulator any name works and no project "
            "is needed; on Google Cloud the bucket belongs to the project given with -p, "
            "else $GOOGLE_CLOUD_PROJECT (or gcloud's $CLOUDSDK_CORE_PROJECT). A bucket that "
            "exists already (yours or anyone's: names are global) is an error (exit 1)."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket mb gs://my-bucket\n"
            "  torchbucket mb -p my-project -l europe-west4 gs://my-training-data"
        ),
    )
    parser.add_argument("uris", nargs="+", metavar="URI", help="gs://bucket (no object name)")
    parser.add_argument("-p", "--project", help="the project that owns the bucket")
    parser.add_argument(
        "-l", "--location", help="where the bucket is kept, e.g. US, EU, europe-west4 (default: US)"
    )
    parser.set_defaults(func=_mb)


def _mb(args: argparse.Namespace) -> int:
    targets = [open_target(uri, args.endpoint) for uri in args.uris]
    for target in targets:
        if target.key:
            raise CommandError(
                f"{target.uri} names an object; mb takes a bucket: gs://{target.uri.bucket}",
                exit_code=EXIT_USAGE,
            )
        if target.uri.scheme != "gs" or not isinstance(target.store, SupportsBuckets):
            raise CommandError(
                f"mb creates GCS buckets (gs://BUCKET); {target.uri} is not one",
                exit_code=EXIT_USAGE,
            )
    for target in targets:
        store = target.store
        assert isinstance(store, SupportsBuckets)
        try:
            runtime.run(store.create_bucket(project=args.project, location=args.location))
        finally:
            runtime.run(target.store.close())
        print(f"created {target.uri}")
    return 0
