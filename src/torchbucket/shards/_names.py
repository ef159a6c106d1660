"""Member names a tar extractor can be trusted with: no absolute, ``..``, empty or NUL parts.

A shard's member is named by its object's name under the source prefix, and
object names are free text: ``raw/../../etc/x`` and ``raw//abs.txt`` are valid
GCS names. In a tar those become ``../../etc/x`` and ``/abs.txt``, which
``tar -x`` (and Python's ``tarfile`` before its ``data`` filter) write
outside the folder they extract into ("tar slip"). ``pack`` refuses such
names before it writes anything; reading a shard never writes files, so the
readers need no such check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torchbucket.errors import ConfigError
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["check_member_names", "unsafe_reason"]

# Windows extractors split on backslashes too, so ``..\x`` climbs there.
_SEPARATORS = re.compile(r"[/\\]")


def unsafe_reason(name: str) -> str | None:
    """Why ``name`` is not a safe tar member name, or ``None`` when it is.

    >>> unsafe_reason("cls0/0001.png") is None
    True
    >>> unsafe_reason("../../outside/pwn.txt")
    "has a '..' segment"
    """
    if not name:
        return "is empty"
    if "\0" in name:
        return "has a NUL character"
    if name.startswith(("/", "\\")):
        return "is absolute (starts with a separator)"
    if ".." in _SEPARATORS.split(name):
        return "has a '..' segment"
    segments = name.split("/")
    if "." in segments:
        return "has a '.' segment"
    if "" in segments:
        return "has an empty segment ('//', or a '/' at its end)"
    return None


def check_member_names(store: ObjectStore, objects: Iterable[ObjectInfo], base: str) -> None:
    """Refuse to pack objects whose member names (their names after ``base``) are unsafe.

    Raises:
        ConfigError: Naming the first such object, why, and how many more there are.
    """
    bad = [(o.name, reason) for o in objects if (reason := unsafe_reason(o.name[len(base) :]))]
    if not bad:
        return
    name, reason = bad[0]
    more = f" (and {len(bad) - 1} more such objects)" if len(bad) > 1 else ""
    raise ConfigError(
        f"pack {store.uri(name)}: its member name {name[len(base) :]!r} {reason}, which a tar "
        f"extractor could write outside its folder; nothing was packed{more}. Rename or "
        "delete the object, or pack a prefix without it"
    )
