"""A listing as columns: the form it is cached in and sent to other ranks.

One list per field (names, sizes, generations, CRC32Cs, an index into the
storage classes present, and the rare content encodings by position) instead
of one ``ObjectInfo`` per object: it pickles and serialises to JSON far
smaller and faster. The listing cache (:mod:`._manifest`) stores it; the
broadcast (:mod:`._broadcast`) sends it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchbucket.storage.base import ObjectInfo

__all__ = ["decode_objects", "encode_objects"]


def encode_objects(objects: Sequence[ObjectInfo]) -> dict[str, list[Any]]:
    """The objects as columns: compact to pickle, broadcast or store."""
    classes = sorted({o.storage_class for o in objects if o.storage_class is not None})
    index = {c: i for i, c in enumerate(classes)}
    return {
        "names": [o.name for o in objects],
        "sizes": [o.size for o in objects],
        "generations": [o.generation for o in objects],
        "crc32c": [o.crc32c for o in objects],
        "classes": classes,
        "class_index": [-1 if o.storage_class is None else index[o.storage_class] for o in objects],
        # Rare: [position, encoding] of the objects that have one.
        "encodings": [
            [i, o.content_encoding] for i, o in enumerate(objects) if o.content_encoding is not None
        ],
    }


def decode_objects(columns: Mapping[str, Sequence[Any]]) -> list[ObjectInfo]:
    """The inverse of :func:`encode_objects`.

    Raises:
        ValueError: The columns are malformed.
    """
    names, sizes = columns["names"], columns["sizes"]
    generations, crcs = columns["generations"], columns["crc32c"]
    classes, class_index = columns["classes"], columns["class_index"]
    if not len(names) == len(sizes) == len(generations) == len(crcs) == len(class_index):
        raise ValueError("manifest columns differ in length")
    objects = [
        ObjectInfo(n, int(s), g, c, None if k < 0 else str(classes[k]))
        for n, s, g, c, k in zip(names, sizes, generations, crcs, class_index)
    ]
    for position, encoding in columns.get("encodings", ()):
        info = objects[position]
        objects[position] = ObjectInfo(
            info.name, info.size, info.generation, info.crc32c, info.storage_class, str(encoding)
        )
    return objects
