"""What every subcommand shares: exit codes, opening stores, sizes, progress bars.

The command line owns the terminal: results go to stdout, progress bars and
errors to stderr, and an error is one line naming the URI, never a traceback
(``-v`` adds the traceback through logging).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from torchbucket._human import human_bytes, plural
from torchbucket._uri import ObjectURI, parse_uri
from torchbucket.config import RetryConfig
from torchbucket.errors import (
    ConfigError,
    InvalidURIError,
    NotFoundError,
    PermissionDeniedError,
    TorchBucketError,
)
from torchbucket.storage import ObjectStore, store_for

if TYPE_CHECKING:
    from torchbucket.storage.gcs import GCSConfig

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PERMISSION",
    "EXIT_USAGE",
    "CommandError",
    "HelpFormatter",
    "Target",
    "exit_code_for",
    "human_bytes",
    "open_target",
    "parse_size",
    "plural",
    "progress_bar",
]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_PERMISSION = 4
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\
exit codes:
  0    success
  1    the operation failed (server error, checksum mismatch, timeout...)
  2    usage error: bad arguments, malformed URI, bad option value
  3    not found: no such bucket, object or local path, or nothing matched the prefix
  4    permission denied (HTTP 401/403, or a local file you may not read or write)
  130  interrupted (Ctrl-C)

URIs: gs://bucket/prefix, memory://name/prefix (this process only), file:///abs/path.
A local path without a scheme is accepted where a command reads or writes local files.
Errors are one line on stderr ("torchbucket: error: ..."); add -v for details."""


class HelpFormatter(argparse.HelpFormatter):
    """Wraps one-paragraph descriptions; keeps text with line breaks as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class CommandError(TorchBucketError):
    """A failure a subcommand reports itself, with the exit code it implies.

    Args:
        message: One line for the user, naming the URI or path.
        exit_code: One of the ``EXIT_*`` codes.
    """

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_for(exc: BaseException) -> int:
    """The exit code that an exception reaching the top of a command implies."""
    if isinstance(exc, CommandError):
        return exc.exit_code
    if isinstance(exc, (InvalidURIError, ConfigError)):
        return EXIT_USAGE
    # NotFoundError and PermissionDeniedError subclass the builtins, so local
    # file errors and store errors share their codes.
    if isinstance(exc, (NotFoundError, FileNotFoundError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, (PermissionDeniedError, PermissionError)):
        return EXIT_PERMISSION
    return EXIT_FAILED


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed URI with the store it points into.

    Attributes:
        uri: The parsed URI.
        store: The store holding its bucket.
        key: The key or prefix inside the store.
    """

    uri: ObjectURI
    store: ObjectStore
    key: str

    def uri_of(self, key: str) -> str:
        """The URI of another key in the same bucket."""
        return str(self.uri.with_key(key))


def is_remote(text: str) -> bool:
    """Whether ``text`` names a bucket URI rather than a local path."""
    return "://" in text and not text.startswith("file://")


def local_path(text: str) -> str:
    """The local path named by a plain path or a ``file://`` URI, made absolute."""
    if text.startswith("file://"):
        parsed = parse_uri(text)
        return "/" + parsed.key
    if "://" in text:
        raise InvalidURIError(f"{text!r} is not a local path")
    return os.path.abspath(os.path.expanduser(text))


_gcs_options: dict[str, Any] = {}


def configure_gcs(*, endpoint: str | None = None, deadline: float | None = None) -> None:
    """Set what :func:`gcs_config` builds for this command (the global options)."""
    _gcs_options.clear()
    if endpoint:
        _gcs_options["endpoint"] = endpoint
    if deadline is not None:
        _gcs_options["retry"] = RetryConfig(
            deadline=deadline, attempt_timeout=min(RetryConfig().attempt_timeout, deadline)
        )


def gcs_config(endpoint: str | None = None) -> GCSConfig:
    """The GCS configuration of this command, with ``endpoint`` if given."""
    from torchbucket.storage.gcs import GCSConfig  # aiohttp loads only for gs://

    options = dict(_gcs_options)
    if endpoint:
        options["endpoint"] = endpoint
    return GCSConfig(**options)


def open_target(uri: str, endpoint: str | None = None) -> Target:
    """Parse ``uri`` and open its store.

    Args:
        uri: ``gs://``, ``memory://`` or ``file://`` URI.
        endpoint: The GCS endpoint for ``gs://``; ``None`` for ``--endpoint``,
            else ``$STORAGE_EMULATOR_HOST`` or Google's.

    Raises:
        InvalidURIError: The URI is malformed.
    """
    parsed = parse_uri(uri)
    options: dict[str, Any] = {}
    if parsed.scheme == "gs":
        options["config"] = gcs_config(endpoint)
    store, key = store_for(parsed, **options)
    return Target(parsed, store, key)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """``"16KiB"``, ``"64M"``, ``"1.5GB"``, ``"4096"`` -> bytes.

    ``K``, ``M``, ``G`` and ``T`` are binary (1024) whether or not an ``i``
    follows, as in ``dd`` and ``gsutil``.

    Raises:
        argparse.ArgumentTypeError: Not a size.
    """
    match = _SIZE_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 16KiB, 64MiB)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** _POWERS[unit.lower()])


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def progress_bar(**kwargs: Any) -> tqdm[Any]:
    """A tqdm bar on stderr, shown only when stderr is a terminal."""
    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("leave", False)
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("disable", not _stderr_is_tty())
    return tqdm(**kwargs)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
