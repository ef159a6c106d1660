"""The ``torchbucket`` command line.

``torchbucket ls|du|cat|cp|rm|mb|pack|cleanup|bench|cost|emulator|demo ...``, also
``python -m torchbucket``. :func:`main` takes the arguments and returns the exit code; it
never raises (but for ``KeyboardInterrupt`` inside ``emulator``, which owns its
own terminal) and never prints a traceback unless ``-v`` asked for details.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from torchbucket._version import __version__
from torchbucket.cli._common import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    HelpFormatter,
    configure_gcs,
    exit_code_for,
    positive_float,
)
from torchbucket.cli._hints import hint_for

__all__ = ["build_parser", "main"]

logger = logging.getLogger("torchbucket.cli")

_GLOBAL_FLAGS = {"-v", "--verbose", "-vv"}
_GLOBAL_WITH_VALUE = {"--endpoint", "--deadline"}


def _common_options(*, top_level: bool) -> argparse.ArgumentParser:
    # Given to the top parser and to every subparser, so `torchbucket -v ls X` and
    # `torchbucket ls -v X` both work. SUPPRESS keeps a subparser's unset option
    # from overwriting what the top level set.
    default = None if top_level else argparse.SUPPRESS
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument(
        "--endpoint",
        metavar="URL",
        default=default,
        help="GCS endpoint for gs:// URIs, e.g. http://127.0.0.1:4443 "
        "(default: $STORAGE_EMULATOR_HOST, else https://storage.googleapis.com)",
    )
    group.add_argument(
        "--deadline",
        metavar="SECONDS",
        type=positive_float,
        default=default,
        help="give up retrying one request after this long, e.g. when the endpoint is "
        "down or throttles (default: 300)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top_level else argparse.SUPPRESS,
        help="log what happens (-v: INFO, -vv: DEBUG, per request) and show tracebacks; "
        "-v also prints the requests made, as --stats does",
    )
    group.add_argument(
        "--stats",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="print the GCS requests this command made (by class A/B/free, bytes, retries, "
        "throttling) and their cost at list prices, to stderr",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the whole command line, subcommands included."""
    from torchbucket.cli._bench import add_bench
    from torchbucket.cli._cat import add_cat
    from torchbucket.cli._cleanup import add_cleanup
    from torchbucket.cli._cost import add_cost
    from torchbucket.cli._cp import add_cp
    from torchbucket.cli._demo import add_demo
    from torchbucket.cli._ls import add_du, add_ls
    from torchbucket.cli._mb import add_mb
    from torchbucket.cli._pack import add_pack
    from torchbucket.cli._rm import add_rm

    parser = argparse.ArgumentParser(
        prog="torchbucket",
        parents=[_common_options(top_level=True)],
        description="Work with training data and checkpoints in object storage "
        "(gs://, memory://, file://).",
        epilog=EXIT_CODES_HELP,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"torchbucket {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    common = _common_options(top_level=False)
    add_ls(sub, common)
    add_du(sub, common)
    add_cat(sub, common)
    add_cp(sub, common)
    add_rm(sub, common)
    add_mb(sub, common)
    add_pack(sub, common)
    add_cleanup(sub, common)
    add_bench(sub, common)
    add_cost(sub, common)
    sub.add_parser(
        "emulator",
        help="run a local GCS emulator (see: torchbucket emulator --help)",
        add_help=False,
    )
    add_demo(sub, common)
    for choice in sub.choices.values():
        if choice.epilog is None:
            choice.epilog = EXIT_CODES_HELP
        elif EXIT_CODES_HELP not in choice.epilog:
            choice.epilog = f"{choice.epilog}\n\n{EXIT_CODES_HELP}"
        choice.formatter_class = HelpFormatter
    return parser


def _emulator_argv(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``emulator`` when that is the command, else ``None``."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_WITH_VALUE:
            i += 2
        elif arg in _GLOBAL_FLAGS or arg.startswith(("--endpoint=", "--deadline=")):
            i += 1
        else:
            return list(argv[i + 1 :]) if arg == "emulator" else None
    return None


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("torchbucket").setLevel(level)


def _print_stats(since: Any) -> None:
    from torchbucket.runtime import accounting, prices

    stats = accounting.snapshot() - since
    print(f"torchbucket: {stats.summary()}", file=sys.stderr)
    print(f"torchbucket: cost {prices.estimate(stats).summary()}", file=sys.stderr)
    for bucket, state in accounting.budget_status().items():
        read, write = state["read"], state["write"]
        print(
            f"torchbucket: budget gs://{bucket} ({state['mode']}): reads {read['job_rate']:g}/s "
            f"for the job, {read['throttled']} throttled; writes {write['job_rate']:g}/s, "
            f"{write['throttled']} throttled",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments, without the program name; ``sys.argv[1:]`` when
            ``None``.

    Returns:
        The exit code: 0 success, 1 failure, 2 usage error, 3 not found,
        4 permission denied, 130 interrupted.
    """
    args_in = list(sys.argv[1:] if argv is None else argv)
    emulator_args = _emulator_argv(args_in)
    if emulator_args is not None:
        from torchbucket.emulator import main as emulator_main

        try:
            return int(emulator_main(emulator_args) or 0)
        except SystemExit as exc:  # its own --help or usage error
            return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2

    parser = build_parser()
    try:
        args = parser.parse_args(args_in)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    _configure_logging(args.verbose)
    configure_gcs(endpoint=args.endpoint, deadline=args.deadline)
    from torchbucket.runtime import accounting

    started = accounting.snapshot()
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("torchbucket: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place every failure becomes a line and a code
        logger.info("%s failed", args.command, exc_info=True)
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"torchbucket: error: {message}{hint_for(exc)}", file=sys.stderr)
        return exit_code_for(exc)
    finally:
        if args.stats or args.verbose:
            _print_stats(started)
