"""GCS operations by name and their billing class: the one table of them.

The client's request accounting (:mod:`torchbucket.runtime.accounting`) and the
emulator's counters and fault rules (:mod:`torchbucket.emulator`) both name
requests by these operations and price them by this table. It is data, not
behaviour, so the emulator may share it and still share no code path with the
client it tests.

Classes follow GCS pricing (https://cloud.google.com/storage/pricing#operations-by-class):
class A are writes, lists, compose, copy/rewrite/move, bucket creation and the
XML multipart calls; class B are reads, metadata reads, bucket reads and
permission checks; deletes (of objects, buckets and multipart uploads) are free.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["OPERATIONS", "OP_CLASS"]

#: Operation -> GCS billing class: ``"A"``, ``"B"`` or ``"free"``.
OP_CLASS: Mapping[str, str] = MappingProxyType(
    {
        "list": "A",
        "put": "A",
        "resumable": "A",
        "compose": "A",
        "copy": "A",
        # objects.move: a write that creates the destination, priced as class A
        # with copy and rewrite.
        "move": "A",
        "patch": "A",
        "mpu_initiate": "A",
        "mpu_part": "A",
        "mpu_complete": "A",
        "mpu_list": "A",
        "mpu_parts": "A",
        "bucket_create": "A",
        "bucket_list": "A",
        "get": "B",
        "head": "B",
        "iam": "B",
        "bucket_get": "B",
        "delete": "free",
        "mpu_abort": "free",
        "bucket_delete": "free",
    }
)

#: Every operation name, in a fixed order (shared-memory layouts rely on it).
OPERATIONS: tuple[str, ...] = tuple(OP_CLASS)
