"""The model store: buckets held in the front server's memory.

Each bucket is a dict of objects (an object lookup is O(1)) and a sorted list of
names (a list page is a bisect and a slice: O(page), whatever the bucket's
size). Each object caches its JSON resource and its download headers, so
serving it costs a dict lookup and a response.
"""

from __future__ import annotations

import base64
import bisect
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchbucket.emulator._http import ApiError, checksums, crc32c_b64, rfc3339

__all__ = ["ModelBucket", "ModelObject", "ModelStore", "Preconditions"]

# GCS's limit on the components behind one composite object.
MAX_COMPONENTS = 1024
MAX_COMPOSE_SOURCES = 32


class ModelObject:
    """One stored object and its metadata."""

    __slots__ = (
        "_headers",
        "_json",
        "_partial",
        "bucket",
        "component_count",
        "content_type",
        "crc32c",
        "created",
        "data",
        "generation",
        "md5",
        "metadata",
        "metageneration",
        "name",
    )

    def __init__(
        self,
        bucket: str,
        name: str,
        data: bytes,
        generation: int,
        created: str,
        *,
        content_type: str = "application/octet-stream",
        metadata: dict[str, str] | None = None,
        component_count: int | None = None,
    ) -> None:
        self.bucket = bucket
        self.name = name
        self.data = data
        self.generation = generation
        self.metageneration = 1
        self.content_type = content_type
        self.metadata = metadata
        self.component_count = component_count
        self.created = created
        if component_count is None:
            self.crc32c, md5 = checksums(data)
            self.md5: str | None = md5
        else:  # GCS composite objects carry a CRC32C but no MD5
            self.crc32c = crc32c_b64(data)
            self.md5 = None
        self._json: bytes | None = None
        self._partial: tuple[tuple[str, ...], bytes] | None = None
        self._headers: dict[str, str] | None = None

    def resource(self, fields: tuple[str, ...] | None = None) -> bytes:
        """The object's JSON API resource, encoded once and cached.

        Args:
            fields: Only these fields (a ``fields`` mask), or ``None`` for all.
                The encoding for the last mask used is cached too.
        """
        if fields is not None:
            cached = self._partial
            if cached is not None and cached[0] is fields:
                return cached[1]
            frags = []
            for field in fields:
                getter = _FIELD_FRAGMENTS.get(field)
                frag = getter(self) if getter is not None else None
                if frag is not None:
                    frags.append(frag)
            encoded = ("{" + ",".join(frags) + "}").encode()
            self._partial = (fields, encoded)
            return encoded
        if self._json is None:
            self._json = json.dumps(self._resource_dict(), separators=(",", ":")).encode()
        return self._json

    def _resource_dict(self) -> dict[str, Any]:
        gen = self.generation
        out: dict[str, Any] = {
            "kind": "storage#object",
            "id": f"{self.bucket}/{self.name}/{gen}",
            "name": self.name,
            "bucket": self.bucket,
            "generation": str(gen),
            "metageneration": str(self.metageneration),
            "contentType": self.content_type,
            "storageClass": "STANDARD",
            "size": str(len(self.data)),
            "crc32c": self.crc32c,
        }
        if self.md5 is not None:
            out["md5Hash"] = self.md5
        if self.component_count is not None:
            out["componentCount"] = self.component_count
        if self.metadata:
            out["metadata"] = self.metadata
        out["etag"] = self.etag
        out["timeCreated"] = out["updated"] = out["timeStorageClassUpdated"] = self.created
        return out

    @property
    def etag(self) -> str:
        """An etag that changes with the generation and metageneration."""
        return f"C{self.generation:x}{self.metageneration:x}"

    def media_headers(self) -> dict[str, str]:
        """Headers of a download of this object (a fresh copy per call)."""
        if self._headers is None:
            hashes = f"crc32c={self.crc32c}"
            if self.md5 is not None:
                hashes += f",md5={self.md5}"
            self._headers = {
                "Content-Type": self.content_type,
                "X-Goog-Hash": hashes,
                "X-Goog-Generation": str(self.generation),
                "X-Goog-Metageneration": str(self.metageneration),
                "X-Goog-Stored-Content-Length": str(len(self.data)),
                "X-Goog-Stored-Content-Encoding": "identity",
                "X-Goog-Storage-Class": "STANDARD",
                "ETag": f'"{self.etag}"',
                "Accept-Ranges": "bytes",
            }
        return dict(self._headers)

    def invalidate(self) -> None:
        """Forget cached encodings after a metadata change."""
        self._json = None
        self._partial = None
        self._headers = None


def _meta_fragment(o: ModelObject) -> str | None:
    return f'"metadata":{json.dumps(o.metadata)}' if o.metadata else None


# Field -> its JSON fragment: a fields mask is served without building the whole
# resource (a first listing of a big bucket encodes every object once).
_FIELD_FRAGMENTS: dict[str, Callable[[ModelObject], str | None]] = {
    "kind": lambda o: '"kind":"storage#object"',
    "id": lambda o: f'"id":{json.dumps(f"{o.bucket}/{o.name}/{o.generation}")}',
    "name": lambda o: f'"name":{json.dumps(o.name)}',
    "bucket": lambda o: f'"bucket":{json.dumps(o.bucket)}',
    "generation": lambda o: f'"generation":"{o.generation}"',
    "metageneration": lambda o: f'"metageneration":"{o.metageneration}"',
    "contentType": lambda o: f'"contentType":{json.dumps(o.content_type)}',
    "storageClass": lambda o: '"storageClass":"STANDARD"',
    "size": lambda o: f'"size":"{len(o.data)}"',
    "crc32c": lambda o: f'"crc32c":"{o.crc32c}"',
    "md5Hash": lambda o: f'"md5Hash":"{o.md5}"' if o.md5 is not None else None,
    "componentCount": lambda o: (
        f'"componentCount":{o.component_count}' if o.component_count is not None else None
    ),
    "metadata": _meta_fragment,
    "etag": lambda o: f'"etag":"{o.etag}"',
    "timeCreated": lambda o: f'"timeCreated":"{o.created}"',
    "updated": lambda o: f'"updated":"{o.created}"',
    "timeStorageClassUpdated": lambda o: f'"timeStorageClassUpdated":"{o.created}"',
}


class ModelBucket:
    """One bucket: objects by name and the sorted list of names."""

    __slots__ = ("created", "keys", "name", "objects")

    def __init__(self, name: str) -> None:
        self.name = name
        self.objects: dict[str, ModelObject] = {}
        self.keys: list[str] = []
        self.created = rfc3339(time.time())

    def resource(self) -> dict[str, Any]:
        """The bucket's JSON API resource."""
        return {
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
        }


class Preconditions:
    """Generation preconditions of a write or a read (GCS query parameters)."""

    __slots__ = ("if_generation_match", "if_generation_not_match", "if_metageneration_match")

    def __init__(
        self,
        if_generation_match: int | None = None,
        if_generation_not_match: int | None = None,
        if_metageneration_match: int | None = None,
    ) -> None:
        self.if_generation_match = if_generation_match
        self.if_generation_not_match = if_generation_not_match
        self.if_metageneration_match = if_metageneration_match

    @classmethod
    def from_query(cls, query: Mapping[str, str], prefix: str = "if") -> Preconditions:
        """Read ``ifGenerationMatch`` & co. (or ``ifSourceGenerationMatch``...)."""
        return cls(
            _int_param(query, f"{prefix}GenerationMatch"),
            _int_param(query, f"{prefix}GenerationNotMatch"),
            _int_param(query, f"{prefix}MetagenerationMatch"),
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


def _int_param(query: Mapping[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"Invalid value for {key}: {value!r}") from None


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

    def create_bucket(self, name: str) -> ModelBucket:
        """Create bucket ``name``; 409 when it exists."""
        if not name:
            raise ApiError(400, "Bucket name is required")
        if name in self.buckets:
            raise ApiError(
                409,
                f"Your previous request to create the named bucket {name} succeeded "
                "and you already own it.",
                xml_code="BucketAlreadyOwnedByYou",
            )
        bucket = self.buckets[name] = ModelBucket(name)
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
        data: bytes,
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        pre: Preconditions | None = None,
        component_count: int | None = None,
    ) -> ModelObject:
        """Write an object (a new generation), checking ``pre`` first."""
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
        del found.objects[name]
        keys = found.keys
        idx = bisect.bisect_left(keys, name)
        del keys[idx]

    def compose(
        self,
        bucket: str,
        name: str,
        sources: list[dict[str, Any]],
        content_type: str | None,
        pre: Preconditions,
    ) -> ModelObject:
        """Concatenate up to 32 source objects into ``name``."""
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
            chunks.append(obj.data)
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
