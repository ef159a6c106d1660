"""The names a checkpoint save stages its upload under, shared with ``cleanup``.

A multipart save on GCS completes under a hidden sibling of the checkpoint,
``dir/.name.tbtmp-<16 hex>`` (see ``checkpoint/_staging.py``), which
torchbucket's listings hide. ``torchbucket cleanup`` looks for names of exactly
this form that a killed save left behind, so the form is defined once, here.
"""

from __future__ import annotations

import re
import uuid

__all__ = ["STAGING_MARK", "is_staging_name", "staging_key", "staging_prefix"]

#: Marks a staging name (``listing`` hides a dot-name with it in any store).
STAGING_MARK = ".tbtmp-"

#: Hex digits of the id that :func:`staging_key` appends.
_ID_DIGITS = 16

# The last segment of exactly what staging_key makes: ".<name>.tbtmp-<16 hex>".
_STAGING_NAME = re.compile(rf"\.[^/]+{re.escape(STAGING_MARK)}[0-9a-f]{{{_ID_DIGITS}}}")


def staging_prefix(key: str) -> str:
    """What every staging name of ``key`` starts with: ``dir/.name.tbtmp-``."""
    directory, slash, name = key.rpartition("/")
    return f"{directory}{slash}.{name}{STAGING_MARK}"


def staging_key(key: str) -> str:
    """A fresh staging name for ``key``."""
    return staging_prefix(key) + uuid.uuid4().hex[:_ID_DIGITS]


def is_staging_name(name: str) -> bool:
    """Whether ``name``'s last segment is one :func:`staging_key` makes.

    Exactly ``.<name>.tbtmp-`` and 16 lowercase hex digits: ``dir/.a.tbtmp``,
    ``dir/a.tbtmp-0123456789abcdef`` or an id of another length are not.
    """
    return _STAGING_NAME.fullmatch(name.rpartition("/")[2]) is not None
