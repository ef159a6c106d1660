"""The XML documents of GCS's multipart upload API, built and parsed.

Parsing ignores XML namespaces (GCS answers in the S3 namespace
``http://s3.amazonaws.com/doc/2006-03-01/``, emulators may use none).
"""

from __future__ import annotations

import datetime as _dt
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from torchbucket.storage.base import MultipartUpload, Part

__all__ = ["ListUploadsPage", "complete_body", "parse_list_uploads", "parse_upload_id"]


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child_text(element: ET.Element, name: str) -> str | None:
    for child in element:
        if _local(child.tag) == name:
            return child.text or ""
    return None


def complete_body(parts: Sequence[Part]) -> bytes:
    """The ``CompleteMultipartUpload`` document for ``parts`` (in the given order)."""
    items = "".join(
        f"<Part><PartNumber>{p.number}</PartNumber><ETag>{escape(p.etag)}</ETag></Part>"
        for p in parts
    )
    return f"<CompleteMultipartUpload>{items}</CompleteMultipartUpload>".encode()


def parse_upload_id(body: bytes) -> str | None:
    """The ``UploadId`` of an ``InitiateMultipartUploadResult``, if present."""
    root = ET.fromstring(body)
    return _child_text(root, "UploadId") or None


@dataclass(frozen=True, slots=True)
class ListUploadsPage:
    """One page of ``ListMultipartUploadsResult``."""

    uploads: list[MultipartUpload]
    next_key_marker: str | None
    next_upload_id_marker: str | None


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_list_uploads(body: bytes) -> ListUploadsPage:
    """Parse a ``ListMultipartUploadsResult`` page."""
    root = ET.fromstring(body)
    uploads = []
    truncated = False
    key_marker = upload_marker = None
    for child in root:
        tag = _local(child.tag)
        if tag == "Upload":
            key = _child_text(child, "Key")
            upload_id = _child_text(child, "UploadId")
            if key is not None and upload_id:
                uploads.append(
                    MultipartUpload(key, upload_id, _timestamp(_child_text(child, "Initiated")))
                )
        elif tag == "IsTruncated":
            truncated = (child.text or "").strip().lower() == "true"
        elif tag == "NextKeyMarker":
            key_marker = child.text or None
        elif tag == "NextUploadIdMarker":
            upload_marker = child.text or None
    if not truncated:
        key_marker = upload_marker = None
    return ListUploadsPage(uploads, key_marker, upload_marker)
