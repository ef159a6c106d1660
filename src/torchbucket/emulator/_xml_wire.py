"""The XML API's wire format: answers, errors re-rendered as XML, the completion body.

Pure helpers of :mod:`torchbucket.emulator._xml_multipart`.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from aiohttp import web

from torchbucket.emulator._http import XML_TYPE, ApiError, error_response

__all__ = ["HEAD", "NS", "as_xml_error", "copy_generation", "parse_complete", "xml"]

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
HEAD = "<?xml version='1.0' encoding='UTF-8'?>"


def xml(body: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    out = web.Response(status=status, body=(HEAD + body).encode(), headers=headers)
    out.headers["Content-Type"] = XML_TYPE
    return out


def as_xml_error(resp: web.Response, no_such: str = "NoSuchKey") -> web.Response:
    """Re-render a JSON API error answer as an XML API error."""
    if resp.status < 400:
        return resp
    try:
        message = json.loads(resp.body or b"{}")["error"]["message"]  # type: ignore[arg-type]
    except (ValueError, KeyError, TypeError):
        message = resp.reason or "error"
    code = no_such if resp.status == 404 else None
    return error_response(resp.status, str(message), xml=True, xml_code=code)


def copy_generation(source: web.Response, out: web.Response) -> None:
    """Carry the new generation of a JSON upload answer into an XML answer."""
    try:
        resource = json.loads(source.body or b"{}")  # type: ignore[arg-type]
    except ValueError:
        return
    if isinstance(resource, dict):
        if "generation" in resource:
            out.headers["x-goog-generation"] = str(resource["generation"])
        hashes = []
        if "crc32c" in resource:
            hashes.append(f"crc32c={resource['crc32c']}")
        if "md5Hash" in resource:
            hashes.append(f"md5={resource['md5Hash']}")
        if hashes:
            out.headers["x-goog-hash"] = ",".join(hashes)


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """The ``(part number, etag)`` pairs of a CompleteMultipartUpload body."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise ApiError(
            400, "The XML you provided was not well-formed.", xml_code="MalformedXML"
        ) from None
    out: list[tuple[int, str]] = []
    for part in root:
        if _local(part.tag) != "Part":
            continue
        number = etag = None
        for child in part:
            tag = _local(child.tag)
            if tag == "PartNumber":
                number = (child.text or "").strip()
            elif tag == "ETag":
                etag = (child.text or "").strip().strip('"')
        if number is None or etag is None:
            raise ApiError(
                400, "Every Part needs a PartNumber and an ETag.", xml_code="MalformedXML"
            )
        try:
            out.append((int(number), etag))
        except ValueError:
            raise ApiError(400, f"Bad PartNumber {number!r}", xml_code="MalformedXML") from None
    if not out:
        raise ApiError(400, "CompleteMultipartUpload lists no parts.", xml_code="MalformedXML")
    return out


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]
