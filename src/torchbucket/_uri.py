"""Parsing of the URIs torchbucket accepts, in one place.

``gs://bucket/key``, ``memory://name/key`` and ``file:///abs/path``. ``gcs://``
is accepted as another spelling of ``gs://`` (gcsfs, fsspec and
gcs-torch-dataflux's Lightning and DCP paths use it) and parses to the same
``gs`` URI. A
``file://`` URI has the filesystem root ``/`` as its bucket and the absolute path,
less its leading ``/``, as its key, so that prefixes behave as they do on a bucket:
``file:///data/train/img_`` is every file under ``/data/train`` whose name starts
with ``img_``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from torchbucket.errors import InvalidURIError

__all__ = [
    "ALIASES",
    "SCHEMES",
    "ObjectURI",
    "as_uri",
    "is_bucket_uri",
    "join_key",
    "parse_uri",
    "uri_text",
]

SCHEMES = ("gs", "memory", "file")
#: Other spellings of a scheme, and the scheme they mean.
ALIASES = {"gcs": "gs"}

# GCS bucket names: 3-63 characters (222 with dots), lowercase letters, digits,
# dashes, underscores and dots, starting and ending with a letter or digit.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class ObjectURI:
    """A parsed URI: scheme, bucket (or local root) and key.

    Attributes:
        scheme: ``"gs"``, ``"memory"`` or ``"file"``.
        bucket: Bucket name; ``"/"`` for ``file``.
        key: Object name or prefix inside the bucket; may be empty.
    """

    scheme: str
    bucket: str
    key: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file:///{self.key}"
        return f"{self.scheme}://{self.bucket}/{self.key}"

    def with_key(self, key: str) -> ObjectURI:
        """Return the same bucket with another key."""
        return ObjectURI(self.scheme, self.bucket, key)


def uri_text(uri: str | os.PathLike[str]) -> str:
    """``uri`` as a string, undoing what ``pathlib.Path`` does to a URI.

    ``Path("gs://bucket/run") / "x"`` is ``gs:/bucket/run/x``: a path collapses
    ``//``. Code written for gcs-torch-dataflux passes such paths (its DCP
    writer's ``checkpoint_id``, Lightning's ``path / name``); a path-like whose
    text starts with a known scheme and ``:/`` is read as that URI again.
    Strings are returned as they are.
    """
    if isinstance(uri, str):
        return uri
    text = os.fspath(uri)
    scheme, sep, rest = text.partition(":/")
    if sep and not rest.startswith("/") and (scheme in SCHEMES or scheme in ALIASES):
        # file:///abs/path became file:/abs/path: the path keeps its leading slash.
        return f"{scheme}:///{rest}" if scheme == "file" else f"{scheme}://{rest}"
    return text


# A URI scheme followed by ':' (two letters at least, so a Windows drive is a path).
_SCHEME_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


def as_uri(uri: str | os.PathLike[str], *, directory: bool = False) -> str:
    """``uri`` as a URI string; a local path becomes the ``file://`` URI of its absolute path.

    A ``pathlib.Path``, ``/data/x`` or ``data/x`` (no ``://``) is a local path,
    as on the command line; a URI (string or path-like, see :func:`uri_text`)
    is returned as it is. Anything else is returned unchanged, for
    :func:`parse_uri` to refuse.

    Args:
        uri: A URI or a local path.
        directory: Give an existing directory a trailing ``/``, so that as a
            prefix it means the files in it, not also its siblings whose names
            start with its own (``/data/train`` would match ``/data/train2/``).
    """
    if not isinstance(uri, (str, os.PathLike)):
        return uri  # type: ignore[unreachable]
    text = uri_text(uri)
    if not isinstance(text, str) or "://" in text or _SCHEME_LIKE.match(text):
        # ``gs:/bucket/x`` is a URI typed wrong, not a local path: parse_uri refuses it.
        return text
    path = os.path.abspath(os.path.expanduser(text))
    if text.endswith(("/", os.sep)) or (directory and os.path.isdir(path)):
        path = path.rstrip("/") + "/"
    return "file://" + path


def is_bucket_uri(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` (a string or a path-like, see :func:`uri_text`) is a URI torchbucket serves."""
    text = uri_text(uri)
    return any(text.startswith(f"{scheme}://") for scheme in (*SCHEMES, *ALIASES))


def parse_uri(uri: str) -> ObjectURI:
    """Parse a ``gs://`` (or ``gcs://``), ``memory://`` or ``file://`` URI.

    Args:
        uri: The URI. A ``file://`` URI must hold an absolute path.

    Returns:
        The scheme, bucket and key. For ``file://`` the bucket is ``"/"`` and the
        key the path without its leading ``/``.

    Raises:
        InvalidURIError: The URI is not a string, has no or an unknown scheme, has
            no bucket, or names a bucket GCS would not accept.
    """
    if not isinstance(uri, str):
        raise InvalidURIError(f"expected a URI string, got {type(uri).__name__}: {uri!r}")
    scheme, sep, rest = uri.partition("://")
    scheme = ALIASES.get(scheme, scheme)
    if not sep:
        raise InvalidURIError(
            f"{uri!r} is not a URI: expected gs://bucket/key, memory://name/key or file:///path"
        )
    if scheme not in SCHEMES:
        raise InvalidURIError(
            f"{uri!r} has unsupported scheme {scheme!r}; expected one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    if scheme == "file":
        if not rest.startswith("/"):
            raise InvalidURIError(f"{uri!r}: a file:// URI needs an absolute path (file:///dir)")
        return ObjectURI("file", "/", rest.lstrip("/"))
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise InvalidURIError(f"{uri!r} names no bucket")
    if scheme == "gs" and not _BUCKET_RE.match(bucket):
        raise InvalidURIError(
            f"{uri!r}: {bucket!r} is not a valid GCS bucket name "
            "(3-63 lowercase letters, digits, '-', '_' or '.')"
        )
    if "\n" in key or "\r" in key:
        raise InvalidURIError(f"{uri!r}: object names may not contain newlines")
    return ObjectURI(scheme, bucket, key)


def join_key(prefix: str, name: str) -> str:
    """Join a prefix and a relative name with exactly one ``/`` between them."""
    if not prefix:
        return name
    return prefix.rstrip("/") + "/" + name.lstrip("/")
