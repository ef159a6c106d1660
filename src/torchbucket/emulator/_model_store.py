"""The model store: buckets held in the front server's memory.

Each bucket is a dict of objects (an object lookup is O(1)) and a sorted list of
names (a list page is a bisect and a slice: O(page), whatever the bucket's
size). Objects (:mod:`._model_object`) cache their encodings.
"""

from __future__ import annotations

import base64
import bisect
import time
from collections.abc import Iterable, Mapping
from typing import Any

from torchbucket.emulator._http import ApiError, rfc3339
from torchbucket.emulator._model_object import ModelObject
from torchbucket.emulator._pieces import Pieces, chunks_of

__all__ = ["ModelBucket", "ModelObject", "ModelStore", "Preconditions"]

# GCS's limit on the components behind one composite object.
MAX_COMPONENTS = 1024
MAX_COMPOSE_SOURCES = 32


class ModelBucket:
    """One bucket: objects by name and the sorted list of names."""

    __slots__ = ("created", "keys", "name", "objects", "soft_delete_seconds", "zonal")

    def __init__(self, name: str, *, zonal: bool = False) -> None:
        self.name = name
        #: A zonal (Rapid) bucket: hierarchical namespace, appendable objects,
        #: no compose, rewrite or XML multipart (``_zonal``).
        self.zonal = zonal
        self.objects: dict[str, ModelObject] = {}
        self.keys: list[str] = []
        self.created = rfc3339(time.time())
        #: Soft-delete retention in seconds; 0 is off (the emulator's default).
        self.soft_delete_seconds = 0

    def resource(self) -> dict[str, Any]:
        """The bucket's JSON API resource."""
        out: dict[str, Any] = {
            "kind": "storage#bucket",
            "id": self.name,
            "name": self.name,
            "projectNumber": "0",
            "metageneration": "1",
            "location": "US-CENTRAL1",
            "locationType": "region",
            "storageClass": "STANDARD",
            "etag": "CAE=",
            "timeCreated": self.created,
            "updated": self.created,
            # As GCS shows it: the field is always there, "0" when off.
            "softDeletePolicy": soft_delete_resource(self.soft_delete_seconds, self.created),
        }
        if self.zonal:
            # A Rapid bucket: a zone as its placement, the RAPID class,
            # hierarchical namespace and uniform access, which GCS requires
            # of one (https://cloud.google.com/storage/docs/rapid/rapid-bucket).
            out["locationType"] = "zone"
            out["customPlacementConfig"] = {"dataLocations": ["US-CENTRAL1-A"]}
            out["storageClass"] = "RAPID"
            out["hierarchicalNamespace"] = {"enabled": True}
            out["iamConfiguration"] = {"uniformBucketLevelAccess": {"enabled": True}}
        return out


#: GCS accepts 0 (off) or 7 to 90 days of soft-delete retention
#: (https://cloud.google.com/storage/docs/soft-delete, read 2026-12-01).
SOFT_DELETE_MIN_S = 7 * 86400
SOFT_DELETE_MAX_S = 90 * 86400


def soft_delete_resource(seconds: int, effective: str) -> dict[str, str]:
    """A bucket's ``softDeletePolicy`` field."""
    if not seconds:
        return {"retentionDurationSeconds": "0"}
    return {"retentionDurationSeconds": str(seconds), "effectiveTime": effective}


def check_soft_delete(seconds: Any) -> int:
    """``seconds`` as GCS accepts it (0, or 7 to 90 days); 400 otherwise."""
    try:
        value = int(seconds)
    except (TypeError, ValueError):
        value = -1
    if value != 0 and not SOFT_DELETE_MIN_S <= value <= SOFT_DELETE_MAX_S:
        raise ApiError(
            400,
            f"softDeletePolicy.retentionDurationSeconds must be 0 or between "
            f"{SOFT_DELETE_MIN_S} and {SOFT_DELETE_MAX_S}, got {seconds!r}",
        )
    return value


class Preconditions:
    """Generation preconditions of a write or a read (GCS query parameters)."""

    __slots__ = (
        "if_generation_match",
        "if_generation_not_match",
        "if_metageneration_match",
        "if_metageneration_not_match",
    )

    def __init__(
        self,
        if_generation_match: int | None = None,
        if_generation_not_match: int | None = None,
        if_metageneration_match: int | None = None,
        if_metageneration_not_match: int | None = None,
    ) -> None:
        self.if_generation_match = if_generation_match
        self.if_generation_not_match = if_generation_not_match
        self.if_metageneration_match = if_metageneration_match
        self.if_metageneration_not_match = if_metageneration_not_match

    @classmethod
    def from_query(cls, query: Mapping[str, str], prefix: str = "if") -> Preconditions:
        """Read ``ifGenerationMatch`` & co. (or ``ifSourceGenerationMatch``...)."""
        return cls(
            _int_param(query, f"{prefix}GenerationMatch"),
            _int_param(query, f"{prefix}GenerationNotMatch"),
            _int_param(query, f"{prefix}MetagenerationMatch"),
            _int_param(query, f"{prefix}MetagenerationNotMatch"),
        )

    def check(self, current: ModelObject | None, what: str) -> None:
        """Raise 412 (or 304-like 412) when ``current`` fails a precondition."""
        gen = current.generation if current is not None else 0
        if self.if_generation_match is not None and self.if_generation_match != gen:
            raise ApiError(
                412,
                f"At least one of the pre-conditions you specified did not hold "
                f"(ifGenerationMatch={self.if_generation_match}, {what} generation {gen}).",
            )
        if self.if_generation_not_match is not None and self.if_generation_not_match == gen:
            raise ApiError(412, f"{what} generation is {gen} (ifGenerationNotMatch)")
        if self.if_metageneration_match is not None and (
            current is None or current.metageneration != self.if_metageneration_match
        ):
            raise ApiError(412, f"{what} metageneration does not match")
        if self.if_metageneration_not_match is not None and (
            current is None or current.metageneration == self.if_metageneration_not_match
        ):
            raise ApiError(412, f"{what} metageneration matches (ifMetagenerationNotMatch)")


def _int_param(query: Mapping[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"Invalid value for {key}: {value!r}") from None


def _unlink(found: ModelBucket, name: str) -> None:
    """Remove live object ``name`` from ``found`` (its dict and its sorted names)."""
    del found.objects[name]
    keys = found.keys
    del keys[bisect.bisect_left(keys, name)]


def encode_token(name: str) -> str:
    """A page token meaning "after ``name``"."""
    return base64.urlsafe_b64encode(name.encode()).decode()


def decode_token(token: str) -> str:
    """The name a page token continues after."""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, f"Invalid page token {token!r}") from None


class ModelStore:
    """Buckets in memory, with GCS semantics for generations and preconditions."""

    def __init__(self) -> None:
        self.buckets: dict[str, ModelBucket] = {}
        self._last_generation = 0

    def new_generation(self) -> int:
        """A generation greater than every earlier one (microseconds, as GCS)."""
        gen = max(time.time_ns() // 1000, self._last_generation + 1)
        self._last_generation = gen
        return gen

    def bucket(self, name: str) -> ModelBucket:
        """The bucket ``name``; 404 when it does not exist."""
        found = self.buckets.get(name)
        if found is None:
            raise ApiError(
                404, f"The specified bucket {name} does not exist.", xml_code="NoSuchBucket"
            )
        return found

    def create_bucket(self, name: str, *, zonal: bool = False) -> ModelBucket:
        """Create bucket ``name`` (a zonal one with ``zonal``); 409 when it exists."""
        if not name:
            raise ApiError(400, "Bucket name is required")
        if name in self.buckets:
            raise ApiError(
                409,
                f"Your previous request to create the named bucket {name} succeeded "
                "and you already own it.",
                xml_code="BucketAlreadyOwnedByYou",
            )
        bucket = self.buckets[name] = ModelBucket(name, zonal=zonal)
        return bucket

    def get(self, bucket: str, name: str, generation: int | None = None) -> ModelObject:
        """The live object; 404 when missing (or not of that generation)."""
        obj = self.bucket(bucket).objects.get(name)
        if obj is None or (generation is not None and obj.generation != generation):
            raise ApiError(404, f"No such object: {bucket}/{name}")
        return obj

    def put(
        self,
        bucket: str,
        name: str,
        data: bytes | Pieces,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        pre: Preconditions | None = None,
        component_count: int | None = None,
        md5: bool = True,
        hashes: tuple[str, str | None] | None = None,
        content_encoding: str | None = None,
    ) -> ModelObject:
        """Write an object (a new generation), checking ``pre`` first.

        ``md5=False``: the object has a CRC32C but no MD5 (a completed XML
        multipart upload, as on GCS).
        """
        if not name:
            raise ApiError(400, "Object name is required")
        found = self.bucket(bucket)
        current = found.objects.get(name)
        if pre is not None:
            pre.check(current, "live object")
        obj = ModelObject(
            bucket,
            name,
            data,
            self.new_generation(),
            rfc3339(time.time()),
            content_type=content_type or "application/octet-stream",
            metadata=metadata,
            component_count=component_count,
            md5=md5,
            hashes=hashes,
            content_encoding=content_encoding,
        )
        found.objects[name] = obj
        if current is None:
            keys = found.keys
            if not keys or keys[-1] < name:
                keys.append(name)
            else:
                bisect.insort(keys, name)
        return obj

    def seed(self, bucket: str, items: Iterable[tuple[str, bytes]]) -> int:
        """Bulk-write objects, sorting the name list once at the end."""
        found = self.bucket(bucket)
        created = rfc3339(time.time())
        objects = found.objects
        new_names: list[str] = []
        count = 0
        for name, data in items:
            if name not in objects:
                new_names.append(name)
            objects[name] = ModelObject(bucket, name, data, self.new_generation(), created)
            count += 1
        if new_names:
            new_names.sort()
            if found.keys and new_names[0] <= found.keys[-1]:
                found.keys.extend(new_names)
                found.keys.sort()  # two sorted runs: timsort merges them in O(n)
            else:
                found.keys.extend(new_names)
        return count

    def delete(self, bucket: str, name: str, generation: int | None, pre: Preconditions) -> None:
        """Delete the live object (of ``generation`` when given)."""
        found = self.bucket(bucket)
        obj = found.objects.get(name)
        if obj is None or (generation is not None and obj.generation != generation):
            raise ApiError(404, f"No such object: {bucket}/{name}")
        pre.check(obj, "live object")
        _unlink(found, name)

    def move(
        self,
        bucket: str,
        source: str,
        dest: str,
        *,
        source_generation: int | None,
        source_pre: Preconditions,
        pre: Preconditions,
    ) -> ModelObject:
        """Rename ``source`` to ``dest`` in one step (GCS's ``objects.move``).

        https://cloud.google.com/storage/docs/json_api/v1/objects/move: the
        move is atomic; the destination gets the source's data and metadata with
        a new generation, metageneration 1 and new timestamps, and replaces a
        live destination unless a precondition says otherwise; the source must
        exist and differ from the destination. Every check runs before anything
        changes, and nothing awaits in between, so no request sees both names
        or neither.
        """
        if source == dest:
            raise ApiError(
                400,
                f"The source and destination object names must differ: {bucket}/{source}",
            )
        found = self.bucket(bucket)
        src = found.objects.get(source)
        if src is None or (source_generation is not None and src.generation != source_generation):
            raise ApiError(404, f"No such object: {bucket}/{source}")
        source_pre.check(src, "source object")
        moved = self.put(
            bucket,
            dest,
            src.data,
            content_type=src.content_type,
            metadata=dict(src.metadata) if src.metadata is not None else None,
            pre=pre,
            component_count=src.component_count,
            hashes=(src.crc32c, src.md5),
            content_encoding=src.content_encoding,
        )
        _unlink(found, source)
        return moved

    def compose(
        self,
        bucket: str,
        name: str,
        sources: list[dict[str, Any]],
        content_type: str | None,
        pre: Preconditions,
        content_encoding: str | None = None,
    ) -> ModelObject:
        """Concatenate up to 32 source objects into ``name``.

        The composite's ``contentEncoding`` is the destination resource's, as on
        GCS, never the sources' (composing gzip objects without it gives raw
        gzip members back to back).
        """
        if not sources:
            raise ApiError(400, "Compose requires at least one source object.")
        if len(sources) > MAX_COMPOSE_SOURCES:
            raise ApiError(
                400,
                f"The number of source components provided ({len(sources)}) exceeds "
                f"the maximum ({MAX_COMPOSE_SOURCES}).",
            )
        found = self.bucket(bucket)
        chunks: list[bytes] = []
        components = 0
        for src in sources:
            src_name = src.get("name")
            if not isinstance(src_name, str) or not src_name:
                raise ApiError(400, "Every source object needs a name.")
            obj = found.objects.get(src_name)
            gen = src.get("generation")
            if obj is None or (gen is not None and int(gen) != obj.generation):
                raise ApiError(404, f"Source object {bucket}/{src_name} not found.")
            match = (src.get("objectPreconditions") or {}).get("ifGenerationMatch")
            if match is not None and int(match) != obj.generation:
                raise ApiError(
                    412, f"Source object {src_name} generation {obj.generation} != {match}."
                )
            chunks.extend(chunks_of(obj.data))
            components += obj.component_count or 1
        if components > MAX_COMPONENTS:
            raise ApiError(
                400,
                f"The composite would have {components} components; the maximum is "
                f"{MAX_COMPONENTS}.",
            )
        return self.put(
            bucket,
            name,
            b"".join(chunks),
            content_type=content_type,
            pre=pre,
            component_count=components,
            content_encoding=content_encoding,
        )

    def list_page(
        self,
        bucket: str,
        *,
        prefix: str = "",
        start_offset: str = "",
        end_offset: str = "",
        page_token: str = "",
        max_results: int = 1000,
        delimiter: str = "",
    ) -> tuple[list[ModelObject], list[str], str | None]:
        """One page of a listing.

        Returns:
            ``(objects, prefixes, next_page_token)``.
        """
        keys = self.bucket(bucket).keys
        objects = self.buckets[bucket].objects
        lower = max(prefix, start_offset)
        idx = bisect.bisect_left(keys, lower)
        if page_token:
            idx = max(idx, bisect.bisect_right(keys, decode_token(page_token)))
        items: list[ModelObject] = []
        prefixes: list[str] = []
        n = len(keys)
        plen = len(prefix)
        last = ""
        while idx < n:
            name = keys[idx]
            if not name.startswith(prefix) or (end_offset and name >= end_offset):
                break
            if len(items) + len(prefixes) >= max_results:
                return items, prefixes, encode_token(last)
            if delimiter:
                cut = name.find(delimiter, plen)
                if cut >= 0:
                    common = name[: cut + len(delimiter)]
                    prefixes.append(common)
                    succ = common[:-1] + chr(ord(common[-1]) + 1)
                    idx = bisect.bisect_left(keys, succ, idx)
                    last = keys[idx - 1]
                    continue
            items.append(objects[name])
            last = name
            idx += 1
        return items, prefixes, None
