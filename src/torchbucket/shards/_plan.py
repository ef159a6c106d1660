"""Planning a pack: which objects go into which shard, at which offsets. Pure functions.

The plan depends on the listing alone (names, sizes, generations, CRC32Cs), so
the same input gives the same shards, byte for byte, and a restarted pack can
tell a complete shard of the same plan from one of another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torchbucket.errors import ConfigError
from torchbucket.shards._tar import BLOCK, END_OF_ARCHIVE, member_header, padding, split_key
from torchbucket.storage.base import ObjectInfo

__all__ = ["PlannedMember", "PlannedShard", "plan_shards", "shard_name"]


def shard_name(number: int) -> str:
    """``3`` -> ``"shard-000003.tar"``."""
    return f"shard-{number:06d}.tar"


@dataclass(frozen=True, slots=True)
class PlannedMember:
    """One member of a planned shard.

    Attributes:
        name: Its name in the tar (the object's name under the source prefix).
        source: The object it is read from.
        header: Its header block(s).
        offset: Where its header starts in the tar.
    """

    name: str
    source: ObjectInfo
    header: bytes
    offset: int

    @property
    def data_offset(self) -> int:
        """Where its data starts in the tar."""
        return self.offset + len(self.header)


@dataclass(frozen=True, slots=True)
class PlannedShard:
    """One shard of a plan.

    Attributes:
        number: Its number (``shard-<number>.tar``).
        members: Its members in tar order.
        sample_starts: The index of each sample's first member.
        size: The tar's size, end-of-archive blocks included.
        fingerprint: SHA-256 over what it holds (names, sizes, generations,
            CRC32Cs of the sources), hex.
    """

    number: int
    members: tuple[PlannedMember, ...]
    sample_starts: tuple[int, ...]
    size: int
    fingerprint: str

    @property
    def name(self) -> str:
        """``shard-000000.tar``..."""
        return shard_name(self.number)

    @property
    def source_bytes(self) -> int:
        """Bytes of the source objects in this shard."""
        return sum(m.source.size for m in self.members)


def _samples(
    objects: Sequence[ObjectInfo], prefix: str, group_by: str
) -> list[list[tuple[str, ObjectInfo]]]:
    if group_by == "none":
        return [[(o.name[len(prefix) :], o)] for o in objects]
    groups: dict[str, list[tuple[str, str, ObjectInfo]]] = {}
    for o in objects:
        rel = o.name[len(prefix) :]
        parts = split_key(rel)
        if parts is None:
            raise ConfigError(
                f"cannot group {rel!r} by key: its last path segment has no extension "
                "(WebDataset names members <key>.<ext>); pack with group_by='none'"
            )
        groups.setdefault(parts[0], []).append((parts[1], rel, o))
    # Sorted by key, then extension: deterministic, and a key's members adjacent.
    return [
        [(rel, o) for _, rel, o in sorted(members, key=lambda m: m[0])]
        for _, members in sorted(groups.items(), key=lambda kv: kv[0].encode("utf-8"))
    ]


def _fingerprint(members: Sequence[PlannedMember]) -> str:
    digest = hashlib.sha256()
    for m in members:
        digest.update(
            f"{m.name}\0{m.source.size}\0{m.source.generation}\0{m.source.crc32c}\n".encode()
        )
    return digest.hexdigest()


def plan_shards(
    objects: Sequence[ObjectInfo],
    prefix: str,
    *,
    shard_size: int,
    group_by: str,
    header: Callable[[str, int], bytes] = member_header,
) -> list[PlannedShard]:
    """Split the objects under ``prefix`` into shards of at most ``shard_size`` bytes.

    A sample (one object, or the objects of one key) never spans two shards;
    a shard closes before the sample that would take it past ``shard_size``.

    Args:
        objects: The listing, every name starting with ``prefix``.
        prefix: The source prefix, cut off the member names.
        shard_size: Target bytes per shard (tar overhead included).
        group_by: ``"key"`` or ``"none"``.
        header: A member's header block(s), of its name and size (a cost
            estimate passes a cheaper one of the same length).

    Raises:
        ConfigError: With ``"key"``, an object name has no extension.
    """
    shards: list[PlannedShard] = []
    members: list[PlannedMember] = []
    starts: list[int] = []
    offset = 0

    def close() -> None:
        nonlocal members, starts, offset
        shards.append(
            PlannedShard(
                number=len(shards),
                members=tuple(members),
                sample_starts=tuple(starts),
                size=offset + len(END_OF_ARCHIVE),
                fingerprint=_fingerprint(members),
            )
        )
        members, starts, offset = [], [], 0

    for sample in _samples(objects, prefix, group_by):
        headers = [header(rel, o.size) for rel, o in sample]
        size = sum(len(hd) + o.size + padding(o.size) for hd, (_, o) in zip(headers, sample))
        if members and offset + size + len(END_OF_ARCHIVE) > shard_size:
            close()
        starts.append(len(members))
        for hd, (rel, o) in zip(headers, sample):
            members.append(PlannedMember(rel, o, hd, offset))
            offset += len(hd) + o.size + padding(o.size)
    if members:
        close()
    assert all(s.size % BLOCK == 0 for s in shards)
    return shards
