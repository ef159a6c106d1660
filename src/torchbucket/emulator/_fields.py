"""GCS ``fields`` masks: which parts of a resource a client asked for.

A mask such as ``items(name,size),nextPageToken`` or ``items/name,prefixes``
is parsed once per distinct string (cached), so a lister that sends the same
mask on every page pays for parsing once.
"""

from __future__ import annotations

import functools

__all__ = ["FieldMask", "parse_fields"]


class FieldMask:
    """A parsed mask.

    Attributes:
        top: Top-level fields asked for, or ``None`` for all.
        items: Fields of each object (of ``items``, or of an object resource
            itself), or ``None`` for all.
    """

    __slots__ = ("items", "top")

    def __init__(self, top: frozenset[str] | None, items: tuple[str, ...] | None) -> None:
        self.top = top
        self.items = items

    def wants(self, field: str) -> bool:
        """Whether top-level ``field`` is in the answer."""
        return self.top is None or field in self.top


ALL = FieldMask(None, None)


def _split(spec: str) -> list[str]:
    """Split at top-level commas (not inside parentheses)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(spec[start:i].strip())
            start = i + 1
    out.append(spec[start:].strip())
    return [p for p in out if p]


@functools.lru_cache(maxsize=256)
def parse_fields(spec: str | None, *, collection: bool = True) -> FieldMask:
    """Parse a ``fields`` query parameter.

    Args:
        spec: The parameter, or ``None``.
        collection: ``True`` for a list answer (``items(...)`` selects object
            fields), ``False`` for one object resource (fields are the
            object's own).

    Returns:
        The mask; :data:`ALL` when ``spec`` is empty.
    """
    if not spec:
        return ALL
    parts = _split(spec)
    if not collection:
        names = tuple(p.split("(", 1)[0].split("/", 1)[0] for p in parts)
        return FieldMask(None, names)
    top: set[str] = set()
    item_fields: list[str] = []
    whole_items = False
    for part in parts:
        if part.startswith("items(") and part.endswith(")"):
            top.add("items")
            item_fields.extend(f.split("(", 1)[0] for f in _split(part[6:-1]))
        elif part.startswith("items/"):
            top.add("items")
            item_fields.append(part[6:].split("/", 1)[0])
        else:
            top.add(part)
            if part == "items":
                whole_items = True
    items = None if whole_items or not item_fields else tuple(dict.fromkeys(item_fields))
    return FieldMask(frozenset(top), items)
