"""Arguments of ``torchbucket demo``: the command line of :mod:`torchbucket.demo`."""

from __future__ import annotations

import argparse
import importlib
import os

from torchbucket.cli._common import EXIT_FAILED, CommandError, positive_int

__all__ = ["add_demo"]

_QUICK = {"objects": 1200, "epochs": 2}
#: What the demo imports beyond the library's own dependencies (the ``demo``
#: extra), by module, with the package that provides it.
_NEEDS = {"PIL": "pillow", "matplotlib": "matplotlib"}


def _check_extras() -> None:
    """Before anything runs: a missing extra was a bare ``No module named 'PIL'``."""
    for module, package in _NEEDS.items():  # pillow first: matplotlib imports it
        try:
            importlib.import_module(module)
        except ImportError:
            missing = package
            break
    else:
        return
    raise CommandError(
        f"torchbucket demo needs {missing}, which is not installed: "
        "pip install 'torchbucket[demo]' (in a clone of the repository: "
        "pip install -e '.[demo]')",
        exit_code=EXIT_FAILED,
    )


def add_demo(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``torchbucket demo``."""
    parser = sub.add_parser(
        "demo",
        parents=[common],
        help="train a small CNN from a bucket, with checkpoints and a restart",
        description=(
            "Start a local GCS emulator with a same-region latency model (or use --bucket), "
            "draw a dataset of small PNG images of six shapes, upload it in parallel, list "
            "it, train a small CNN through BucketMapDataset and a multi-worker DataLoader, "
            "checkpoint every epoch to the bucket, stop, restart from the latest checkpoint "
            "as a new job would and finish training, then print a summary (throughput, "
            "requests by class, listing and checkpoint times, accuracy) and write a figure "
            "and summary.json to --out. Exits 1 if anything is left in the bucket (a "
            "composed object or an incomplete upload)."
        ),
        epilog=(
            "examples:\n"
            "  torchbucket demo                         # about 2 minutes on 2 cores\n"
            "  torchbucket demo --quick                 # a small run, seconds\n"
            "  torchbucket demo --bucket gs://my-bucket/torchbucket-demo/   # real GCS"
        ),
    )
    parser.add_argument(
        "--objects", type=positive_int, default=None, help="images to generate (default: 20000)"
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help="epochs in all, at least 2; the restart comes before the last (default: 3)",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="DataLoader worker processes (default: 2)"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=64, help="images per batch (default: 64)"
    )
    parser.add_argument(
        "--out",
        default="demo-output",
        metavar="DIR",
        help="where the figure and summary.json go (default: ./demo-output)",
    )
    parser.add_argument(
        "--bucket",
        metavar="gs://BUCKET/PREFIX",
        help="use this bucket (application default credentials) instead of the emulator; "
        "the dataset is kept there for the next run, checkpoints go under PREFIX/checkpoints/; "
        "--endpoint applies to it",
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="no modelled latency in the emulator (loopback speed)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a small run: {_QUICK['objects']} images, {_QUICK['epochs']} epochs",
    )
    parser.add_argument(
        "--compose",
        action="store_true",
        help="coalesce small objects server-side instead of reading every image with its "
        "own GET (compose makes class A requests; compare the summaries)",
    )
    parser.add_argument("--seed", type=int, default=0, help="picks the images (default: 0)")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    _check_extras()
    import torch

    from torchbucket.demo import DemoConfig, format_summary, run_demo, write_figure, write_json

    torch.set_num_threads(1)  # the other core feeds the DataLoader workers and the emulator
    config = DemoConfig(
        objects=args.objects or (_QUICK["objects"] if args.quick else 20_000),
        epochs=args.epochs or (_QUICK["epochs"] if args.quick else 3),
        workers=args.workers,
        batch_size=args.batch_size,
        out=args.out,
        bucket=args.bucket,
        endpoint=args.endpoint,
        latency=not args.no_latency,
        seed=args.seed,
        compose=args.compose,
    )
    result = run_demo(config)
    figure = write_figure(result, os.path.join(config.out, "demo.png"))
    write_json(result, os.path.join(config.out, "summary.json"))
    print(format_summary(result, figure), flush=True)
    if result.uploads_left or result.composites_left:
        return EXIT_FAILED
    return 0
