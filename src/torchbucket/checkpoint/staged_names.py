"""The names a checkpoint save stages its upload under, shared with ``cleanup``.

A multipart save on GCS completes under a hidden sibling of the checkpoint,
``dir/.name.tbtmp-<16 hex>`` (see ``checkpoint/_staging.py``), which
torchbucket's listings hide. ``torchbucket cleanup`` looks for names of exactly
this form that a killed save left behind, so the form is defined once, here.

A staging name is 24 bytes longer than the checkpoint's, and GCS refuses names
over 1,024 bytes of UTF-8. Where the name would not fit, ``name`` is replaced
by a 32-hex digest of the whole checkpoint name (``dir/.<digest>.tbtmp-<id>``,
56 bytes after the ``/``), and where even that would not fit (a directory
part over 967 bytes), it goes into the deepest directory above in which it
does. Either way it has the same form, so listings hide it and ``cleanup``
finds it, and each checkpoint keeps one prefix of its own (for aborting the
uploads an earlier save left).
"""

from __future__ import annotations

import hashlib
import re
import uuid

__all__ = [
    "MAX_NAME_BYTES",
    "STAGING_MARK",
    "is_staging_name",
    "staging_key",
    "staging_prefix",
]

#: Marks a staging name (``listing`` hides a dot-name with it in any store).
STAGING_MARK = ".tbtmp-"

#: Hex digits of the id that :func:`staging_key` appends.
_ID_DIGITS = 16

#: GCS's limit on an object name, in bytes of UTF-8.
MAX_NAME_BYTES = 1024

#: Hex digits of the digest that stands for a name too long to stage beside.
_DIGEST_DIGITS = 32

# The last segment of exactly what staging_key makes: ".<name>.tbtmp-<16 hex>".
_STAGING_NAME = re.compile(rf"\.[^/]+{re.escape(STAGING_MARK)}[0-9a-f]{{{_ID_DIGITS}}}")


def staging_prefix(key: str) -> str:
    """What every staging name of ``key`` starts with: ``dir/.name.tbtmp-``.

    Within GCS's 1,024 bytes with the id for every ``key`` GCS takes: the
    name is replaced by a digest of ``key`` where it would not fit, and the
    directory by the deepest one above it that fits where even that would not.
    """
    directory, slash, name = key.rpartition("/")
    prefix = f"{directory}{slash}.{name}{STAGING_MARK}"
    if _fits(prefix):
        return prefix
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_DIGITS]
    while True:
        prefix = f"{directory}{slash}.{digest}{STAGING_MARK}"
        if _fits(prefix) or not directory:
            return prefix
        directory, slash, _ = directory.rpartition("/")


def _fits(prefix: str) -> bool:
    return len(prefix.encode("utf-8", "surrogatepass")) + _ID_DIGITS <= MAX_NAME_BYTES


def staging_key(key: str) -> str:
    """A fresh staging name for ``key``."""
    return staging_prefix(key) + uuid.uuid4().hex[:_ID_DIGITS]


def is_staging_name(name: str) -> bool:
    """Whether ``name``'s last segment is one :func:`staging_key` makes.

    Exactly ``.<name>.tbtmp-`` and 16 lowercase hex digits: ``dir/.a.tbtmp``,
    ``dir/a.tbtmp-0123456789abcdef`` or an id of another length are not.
    """
    return _STAGING_NAME.fullmatch(name.rpartition("/")[2]) is not None
