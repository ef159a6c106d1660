"""The index of one shard and the manifest of a shard set: small JSON documents.

An index (``shard-000000.idx.json`` beside ``shard-000000.tar``) lists the
shard's members in order: name, offset of its data in the tar, size and
CRC32C, and where each sample's members begin. With it a reader fetches any
sample with one ranged GET, splits a shard's samples over workers without
reading it, and checks every member's bytes. The manifest (``manifest.json``)
lists the shards of a set, with their sizes, CRC32Cs and sample counts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "INDEX_SUFFIX",
    "MANIFEST_NAME",
    "Manifest",
    "ManifestShard",
    "ShardIndex",
    "index_name",
]

MANIFEST_NAME = "manifest.json"
INDEX_SUFFIX = ".idx.json"
_INDEX_FORMAT = "torchbucket-shard-index"
_MANIFEST_FORMAT = "torchbucket-shards"
_VERSION = 1


def index_name(shard_name: str) -> str:
    """``".../shard-000003.tar"`` -> ``".../shard-000003.idx.json"``."""
    stem = shard_name[: -len(".tar")] if shard_name.endswith(".tar") else shard_name
    return stem + INDEX_SUFFIX


class ShardIndex:
    """The members of one shard, column by column (numpy arrays, a names blob).

    Args:
        names: Member names in tar order.
        offsets: Offset of each member's data in the tar.
        sizes: Size of each member's data.
        crc32c: CRC32C of each member's data (unsigned 32-bit).
        sample_starts: Index of the first member of each sample, ascending,
            starting at 0.
        size: Size of the whole tar.
        fingerprint: What the shard was packed from (see the packer).
        shard_crc32c: The whole tar's CRC32C as GCS reports it (base64), or "".
    """

    def __init__(
        self,
        names: Sequence[str],
        offsets: Sequence[int],
        sizes: Sequence[int],
        crc32c: Sequence[int],
        sample_starts: Sequence[int],
        *,
        size: int,
        fingerprint: str = "",
        shard_crc32c: str = "",
    ) -> None:
        if not len(names) == len(offsets) == len(sizes) == len(crc32c):
            raise ValueError("index columns differ in length")
        encoded = [n.encode("utf-8") for n in names]
        self._blob = b"".join(encoded)
        self._name_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self._name_offsets[1:])
        self.offsets: npt.NDArray[np.int64] = np.asarray(offsets, dtype=np.int64)
        self.sizes: npt.NDArray[np.int64] = np.asarray(sizes, dtype=np.int64)
        self.crc32c: npt.NDArray[np.uint32] = np.asarray(crc32c, dtype=np.uint32)
        starts = np.asarray(sample_starts, dtype=np.int64)
        if len(names) and (not len(starts) or starts[0] != 0 or np.any(np.diff(starts) <= 0)):
            raise ValueError("sample starts must ascend from 0")
        if len(starts) and starts[-1] >= len(names):
            raise ValueError("a sample starts past the last member")
        # One past the last member of each sample, as a sentinel.
        self.sample_bounds: npt.NDArray[np.int64] = np.append(starts, len(names))
        self.size = int(size)
        self.fingerprint = fingerprint
        self.shard_crc32c = shard_crc32c
        ends = self.offsets + self.sizes
        if len(ends) and (np.any(self.offsets < 0) or int(ends.max()) > self.size):
            raise ValueError("a member lies outside the shard")

    @property
    def num_members(self) -> int:
        """Members in the shard."""
        return len(self.sizes)

    @property
    def num_samples(self) -> int:
        """Samples in the shard."""
        return len(self.sample_bounds) - 1

    def name(self, member: int) -> str:
        """The name of member ``member``."""
        lo, hi = self._name_offsets[member], self._name_offsets[member + 1]
        return self._blob[lo:hi].decode("utf-8")

    def members_of(self, sample: int) -> range:
        """The member indices of sample ``sample``."""
        return range(int(self.sample_bounds[sample]), int(self.sample_bounds[sample + 1]))

    def data_range(self, first_sample: int, stop_sample: int) -> tuple[int, int]:
        """The byte range from the first member's data to the last one's end."""
        first = int(self.sample_bounds[first_sample])
        last = int(self.sample_bounds[stop_sample]) - 1
        return int(self.offsets[first]), int(self.offsets[last] + self.sizes[last])

    def to_json(self, shard: str) -> bytes:
        """The index as the JSON document stored beside the shard."""
        doc = {
            "format": _INDEX_FORMAT,
            "version": _VERSION,
            "shard": shard,
            "size": self.size,
            "fingerprint": self.fingerprint,
            "shard_crc32c": self.shard_crc32c,
            "names": [self.name(i) for i in range(self.num_members)],
            "offsets": self.offsets.tolist(),
            "sizes": self.sizes.tolist(),
            "crc32c": self.crc32c.tolist(),
            "sample_starts": self.sample_bounds[:-1].tolist(),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardIndex:
        """Parse an index document.

        Raises:
            ValueError: Not a shard index, or inconsistent.
        """
        try:
            doc = json.loads(data)
            if doc.get("format") != _INDEX_FORMAT or doc.get("version") != _VERSION:
                raise ValueError("not a torchbucket shard index (format or version)")
            return cls(
                doc["names"],
                doc["offsets"],
                doc["sizes"],
                doc["crc32c"],
                doc["sample_starts"],
                size=int(doc["size"]),
                fingerprint=str(doc.get("fingerprint", "")),
                shard_crc32c=str(doc.get("shard_crc32c", "")),
            )
        except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed shard index: {exc!r}") from exc


@dataclass(frozen=True, kw_only=True, slots=True)
class ManifestShard:
    """One shard of a manifest.

    Attributes:
        name: The shard's object name relative to the set's prefix.
        size: Its size in bytes.
        crc32c: Its CRC32C as GCS reports it (base64).
        samples: Samples in it.
        members: Members in it.
        fingerprint: What it was packed from.
    """

    name: str
    size: int
    crc32c: str
    samples: int
    members: int
    fingerprint: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """The shards of a set, in order, and how they were packed.

    Attributes:
        source: URI of the prefix the set was packed from.
        group_by: ``"key"`` (a sample is the members of one key) or ``"none"``
            (a sample is one member).
        shard_size: The target shard size.
        shards: The shards.
    """

    source: str
    group_by: str
    shard_size: int
    shards: tuple[ManifestShard, ...]

    @property
    def num_samples(self) -> int:
        """Samples over all shards."""
        return sum(s.samples for s in self.shards)

    def to_json(self) -> bytes:
        """The manifest document."""
        doc: dict[str, Any] = {
            "format": _MANIFEST_FORMAT,
            "version": _VERSION,
            "source": self.source,
            "group_by": self.group_by,
            "shard_size": self.shard_size,
            "samples": self.num_samples,
            "shards": [
                {
                    "name": s.name,
                    "index": index_name(s.name),
                    "size": s.size,
                    "crc32c": s.crc32c,
                    "samples": s.samples,
                    "members": s.members,
                    "fingerprint": s.fingerprint,
                }
                for s in self.shards
            ],
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse a manifest.

        Raises:
            ValueError: Not a torchbucket shard manifest.
        """
        try:
            doc = json.loads(data)
            if doc.get("format") != _MANIFEST_FORMAT or doc.get("version") != _VERSION:
                raise ValueError("not a torchbucket shard manifest (format or version)")
            shards = tuple(
                ManifestShard(
                    name=str(s["name"]),
                    size=int(s["size"]),
                    crc32c=str(s["crc32c"]),
                    samples=int(s["samples"]),
                    members=int(s["members"]),
                    fingerprint=str(s["fingerprint"]),
                )
                for s in doc["shards"]
            )
            return cls(
                source=str(doc["source"]),
                group_by=str(doc["group_by"]),
                shard_size=int(doc["shard_size"]),
                shards=shards,
            )
        except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed shard manifest: {exc!r}") from exc
