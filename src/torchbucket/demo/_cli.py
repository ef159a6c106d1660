"""Arguments of ``torchbucket demo``."""

from __future__ import annotations

import argparse

__all__ = ["add_demo"]


def add_demo(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``torchbucket demo``."""
    parser = sub.add_parser("demo", parents=[common], help="train a model from a bucket")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from torchbucket.cli._common import CommandError

    raise CommandError("the demo is not built yet (issue 6)")
