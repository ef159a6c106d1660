"""One object of the model store: its bytes, metadata and cached encodings.

An object encodes its JSON resource once (and once more per ``fields`` mask it
is asked for, from per-field fragments), and its download headers once, so
serving it again costs a dict lookup.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from typing import Any

from torchbucket.emulator._pieces import Pieces, checksums, crc32c_b64

__all__ = ["ModelObject"]


class ModelObject:
    """One stored object and its metadata."""

    __slots__ = (
        "_decoded",
        "_headers",
        "_json",
        "_partial",
        "bucket",
        "component_count",
        "content_encoding",
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

    # An object resource's fields: five every object has, the rest keyword-only
    # with GCS's defaults (a record, built in two places).
    def __init__(  # noqa: PLR0913
        self,
        bucket: str,
        name: str,
        data: bytes | Pieces,
        generation: int,
        created: str,
        *,
        content_type: str = "application/octet-stream",
        metadata: dict[str, str] | None = None,
        component_count: int | None = None,
        md5: bool = True,
        content_encoding: str | None = None,
        hashes: tuple[str, str | None] | None = None,
    ) -> None:
        self.bucket = bucket
        self.name = name
        self.data = data
        self.generation = generation
        self.metageneration = 1
        self.content_type = content_type
        self.content_encoding = content_encoding or None
        self.metadata = metadata
        self.component_count = component_count
        self.created = created
        self.md5: str | None
        if hashes is not None:  # a copy: GCS does not read the bytes again
            self.crc32c, self.md5 = hashes
        elif component_count is None and md5:
            self.crc32c, md5_b64 = checksums(data)
            self.md5 = md5_b64
        else:  # composite objects and XML multipart uploads: a CRC32C but no MD5
            self.crc32c = crc32c_b64(data)
            self.md5 = None
        self._json: bytes | None = None
        self._partial: tuple[tuple[str, ...], bytes] | None = None
        self._headers: dict[str, str] | None = None
        self._decoded: bytes | None = None

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
        if self.content_encoding:
            out["contentEncoding"] = self.content_encoding
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
                "X-Goog-Stored-Content-Encoding": self.content_encoding or "identity",
                "X-Goog-Storage-Class": "STANDARD",
                "ETag": f'"{self.etag}"',
                "Accept-Ranges": "bytes",
            }
        return dict(self._headers)

    def decoded(self) -> bytes | None:
        """The bytes GCS serves by decompressive transcoding, or ``None``.

        ``None`` unless the object is stored with ``Content-Encoding: gzip``
        and its bytes decode (what GCS does with bytes that do not is not
        documented; they are served as stored).
        """
        if self.content_encoding != "gzip":
            return None
        if self._decoded is None:
            try:
                self._decoded = gzip.decompress(bytes(self.data))  # no copy of a bytes
            except (OSError, EOFError, zlib.error):
                return None
        return self._decoded

    def invalidate(self) -> None:
        """Forget cached encodings after a metadata change."""
        self._json = None
        self._partial = None
        self._headers = None
        self._decoded = None


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
    "contentEncoding": lambda o: (
        f'"contentEncoding":{json.dumps(o.content_encoding)}' if o.content_encoding else None
    ),
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
