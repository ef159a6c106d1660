"""The checksums a client declares with an upload, checked the way GCS checks them.

GCS refuses a write whose declared CRC32C or MD5 does not match the bytes it
received, and nothing becomes visible
(https://cloud.google.com/storage/docs/data-validation, "Server-side
validation for data writes"). Where a client declares them:

- JSON API: ``crc32c`` / ``md5Hash`` in the object resource (a multipart/related
  upload's metadata part, a resumable session's metadata), or an
  ``x-goog-hash`` header on the request that finalizes a resumable upload. A
  mismatch is a 400 with reason ``invalid`` and the message
  ``Provided CRC32C "<sent>" doesn't match calculated CRC32C "<computed>".``
  (as quoted from GCS in googleapis/python-storage#1541 and
  googleapis/google-cloud-java#267);
- XML API: ``x-goog-hash: crc32c=...,md5=...`` or ``Content-MD5`` on a PUT of an
  object or of a multipart part
  (https://cloud.google.com/storage/docs/xml-api/put-object-multipart). A
  mismatch is a 400 whose code is one of ``BadDigest`` / ``InvalidDigest`` /
  ``CrcMismatch`` (googleapis/python-storage#1529); this emulator answers
  ``BadDigest``, and ``InvalidDigest`` for a value that is not a digest at all.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from torchbucket.emulator._http import ApiError
from torchbucket.emulator._pieces import Pieces, crc32c_b64, md5_b64

__all__ = ["Declared", "check_declared", "declared_in_headers", "declared_in_metadata"]


class Declared:
    """The CRC32C and MD5 (base64, as GCS writes them) a client declared, if any."""

    __slots__ = ("crc32c", "md5")

    def __init__(self, crc32c: str | None = None, md5: str | None = None) -> None:
        self.crc32c = crc32c
        self.md5 = md5

    def __bool__(self) -> bool:
        return self.crc32c is not None or self.md5 is not None


def _valid(value: str, size: int, what: str, xml: bool) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise ApiError(
            400,
            f"The {what} you specified ({value!r}) is not a valid base64 {what}.",
            xml_code="InvalidDigest" if xml else None,
        )
    return value


def declared_in_headers(headers: Mapping[str, str], *, xml: bool) -> Declared:
    """``x-goog-hash`` (``crc32c=``, ``md5=``; repeated or comma-joined) and ``Content-MD5``."""
    out = Declared()
    values = headers.getall("x-goog-hash", []) if hasattr(headers, "getall") else []
    if not values and headers.get("x-goog-hash"):
        values = [headers["x-goog-hash"]]
    for value in values:
        for item in value.split(","):
            name, sep, digest = item.strip().partition("=")
            if not sep:
                continue
            name = name.strip().lower()
            if name == "crc32c":
                out.crc32c = _valid(digest.strip(), 4, "CRC32C", xml)
            elif name == "md5":
                out.md5 = _valid(digest.strip(), 16, "MD5", xml)
    content_md5 = headers.get("Content-MD5")
    if content_md5:
        out.md5 = _valid(content_md5.strip(), 16, "MD5", xml)
    return out


def declared_in_metadata(meta: Mapping[str, object]) -> Declared:
    """``crc32c`` and ``md5Hash`` of a JSON object resource."""
    crc, md5 = meta.get("crc32c"), meta.get("md5Hash")
    return Declared(
        None if crc is None else str(crc),
        None if md5 is None else str(md5),
    )


def check_declared(declared: Declared, data: bytes | Pieces, *, xml: bool = False) -> None:
    """Raise GCS's 400 when ``data`` does not match what was declared for it."""
    if not declared:
        return
    if declared.crc32c is not None:
        got = crc32c_b64(data)
        if got != declared.crc32c:
            if xml:
                raise ApiError(
                    400,
                    "The CRC32C you specified did not match the calculated CRC32C "
                    f"({declared.crc32c} sent, {got} received).",
                    xml_code="BadDigest",
                )
            raise ApiError(
                400,
                f'Provided CRC32C "{declared.crc32c}" doesn\'t match calculated CRC32C "{got}".',
                reason="invalid",
            )
    if declared.md5 is not None:
        got = md5_b64(data)
        if got != declared.md5:
            if xml:
                raise ApiError(
                    400,
                    "The Content-MD5 you specified did not match what was received "
                    f"({declared.md5} sent, {got} received).",
                    xml_code="BadDigest",
                )
            raise ApiError(
                400,
                f'Provided MD5 hash "{declared.md5}" doesn\'t match calculated MD5 hash "{got}".',
                reason="invalid",
            )
