"""Pure helpers of the GCS backend: object resources, CRC32C and header parsing."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

from torchbucket.errors import IntegrityError
from torchbucket.storage import crc32c as _crc32c
from torchbucket.storage.base import ObjectInfo

__all__ = [
    "INFO_FIELDS",
    "check_span",
    "content_range",
    "crc32c_of",
    "crc_b64",
    "extend_crc",
    "hash_header_crc32c",
    "object_info",
    "object_infos",
    "persisted",
    "quote_name",
    "range_header",
    "stream_end",
    "verify_crc32c",
]

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.~/-]*")

#: The object fields torchbucket reads: the ``fields`` mask of every request.
INFO_FIELDS = "name,size,generation,crc32c,storageClass,contentEncoding"


# ObjectInfo is a frozen dataclass: its __init__ sets each field through
# object.__setattr__. Setting the slots directly gives the same object in less
# than half the time, which counts when a listing turns 1,000 resources a page
# into ObjectInfo. (ObjectInfo has no __post_init__ that this would skip.)
_new_info = object.__new__
_slot_setters: tuple[Callable[[ObjectInfo, Any], None], ...] = tuple(
    ObjectInfo.__dict__[f].__set__
    for f in ("name", "size", "generation", "crc32c", "storage_class", "content_encoding")
)


def object_info(doc: Mapping[str, Any]) -> ObjectInfo:
    """An :class:`ObjectInfo` from a JSON API object resource."""
    return object_infos((doc,))[0]


def object_infos(docs: Iterable[Mapping[str, Any]]) -> list[ObjectInfo]:
    """:class:`ObjectInfo` of each JSON API object resource (a listing page's items)."""
    set_name, set_size, set_generation, set_crc32c, set_class, set_encoding = _slot_setters
    new = _new_info
    out: list[ObjectInfo] = []
    append = out.append
    for doc in docs:
        info = new(ObjectInfo)
        set_name(info, doc["name"])
        size = doc.get("size")
        set_size(info, 0 if size is None else int(size))
        generation = doc.get("generation")
        set_generation(info, None if generation is None else int(generation))
        set_crc32c(info, doc.get("crc32c"))
        set_class(info, doc.get("storageClass"))
        # GCS omits contentEncoding where none was set; "identity" means none too.
        encoding = doc.get("contentEncoding")
        set_encoding(info, None if encoding in (None, "", "identity") else encoding)
        append(info)
    return out


#: ``extend_crc(crc, data)``: the CRC32C of what ``crc`` covered followed by ``data``
#: (a writable buffer is checksummed in place, without the GIL).
extend_crc = _crc32c.extend

#: ``crc_b64(crc)``: a CRC32C value as GCS writes it, base64 of the 4 big-endian bytes.
crc_b64 = _crc32c.b64


def quote_name(name: str) -> str:
    """Percent-encode an object name (or any value) for a URL path or query.

    Every byte but the unreserved ``A-Z a-z 0-9 - . _ ~`` is encoded, ``/``
    included. Typical names (letters, digits, ``/``) take a fast path.
    """
    if _PLAIN_NAME.fullmatch(name):
        return name.replace("/", "%2F")
    return quote(name, safe="")


#: ``crc32c_of(data)``: base64 CRC32C of ``data`` (in place where it is writable).
crc32c_of = _crc32c.crc32c_b64


def hash_header_crc32c(headers: Mapping[str, str]) -> str | None:
    """The ``crc32c=`` part of the ``x-goog-hash`` headers, if any."""
    first = headers.get("x-goog-hash")
    if first is None:
        return None
    start = first.find("crc32c=")
    if start >= 0:
        stop = first.find(",", start)
        return first[start + 7 : None if stop < 0 else stop].strip()
    values: list[str] = (
        headers.getall("x-goog-hash", [])  # type: ignore[attr-defined]
        if hasattr(headers, "getall")
        else [first]
    )
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part.startswith("crc32c="):
                return part[7:]
    return None


def content_range(headers: Mapping[str, str]) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of ``Content-Range: bytes first-last/total``."""
    value = headers.get("Content-Range")
    if not value or not value.startswith("bytes "):
        return None
    span, _, total = value[6:].partition("/")
    first, _, last = span.partition("-")
    try:
        return int(first), int(last), (int(total) if total and total != "*" else None)
    except ValueError:
        return None


def check_span(span: tuple[int, int, int | None], start: int, received: int, uri: str) -> bool:
    """Check a 206's ``Content-Range`` against the range asked for and the bytes received.

    Returns:
        Whether the range is the whole object (so its CRC32C can be checked).

    Raises:
        IntegrityError: The answer starts elsewhere, or its length is not the span's.
    """
    first, last, total = span
    if first != start or received != last - first + 1:
        raise IntegrityError(
            f"expected bytes {first}-{last}, received {received}", operation="get", uri=uri
        )
    return first == 0 and total == received


def verify_crc32c(headers: Mapping[str, str], checksum: str, uri: str) -> None:
    """Raise ``IntegrityError`` if the object's CRC32C in ``headers`` is not ``checksum``.

    Nothing is checked on an answer the server decompressed (decompressive
    transcoding of a gzip object): its ``x-goog-hash`` is that of the stored,
    compressed bytes (https://cloud.google.com/storage/docs/transcoding). Reads
    ask for the stored bytes (``Accept-Encoding: gzip``) and check those.
    """
    expected = hash_header_crc32c(headers)
    if (
        expected is not None
        and expected != checksum
        and not (
            headers.get("x-goog-stored-content-encoding", "").lower() == "gzip"
            and "gzip" not in headers.get("Content-Encoding", "").lower()
        )
    ):
        raise IntegrityError(
            f"CRC32C mismatch: server says {expected}, received bytes give {checksum}",
            operation="get",
            uri=uri,
        )


def range_header(start: int, end: int | None) -> dict[str, str] | None:
    """The ``Range`` header for ``[start, end)``, or ``None`` for the whole object."""
    if start == 0 and end is None:
        return None
    return {"Range": f"bytes={start}-{'' if end is None else end - 1}"}


def persisted(headers: Mapping[str, str]) -> int:
    """Bytes a resumable session holds, from the ``Range: bytes=0-N`` of a 308."""
    value = headers.get("Range")
    if not value:
        return 0
    _, _, last = value.partition("-")
    return int(last) + 1


def stream_end(end: int | None, total: int | None) -> int | None:
    """Where a stream of ``[..., end)`` of an object of ``total`` bytes stops."""
    if total is None:
        return end
    return total if end is None else min(end, total)
