"""Map a request's method, raw path and query to a :class:`Route`.

Paths are parsed by string operations on the raw (still percent-encoded) path,
so an object name's encoded ``/`` (``%2F``) never splits it; no regular
expressions run per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote as _unquote

from torchbucket.emulator._http import Route

__all__ = ["parse_route"]

_JSON_PREFIXES = ("/storage/v1/b", "/download/storage/v1/b")
_UPLOAD_PREFIX = "/upload/storage/v1/b/"


def unquote(text: str) -> str:
    """Percent-decode ``text``, fast for names whose only escapes are ``%2F``."""
    if "%" not in text:
        return text
    if text.count("%") == text.count("%2F"):
        return text.replace("%2F", "/")
    return _unquote(text)


def parse_route(method: str, path: str, query: Mapping[str, str]) -> Route:
    """Parse a request for the GCS JSON or XML API.

    Args:
        method: HTTP method (upper case).
        path: Raw path, without the query string.
        query: Parsed query parameters.

    Returns:
        The route; ``kind == "unknown"`` when nothing matches.
    """
    if path.startswith("/storage/v1/b"):
        return _json_route(method, path[13:], query)
    if path.startswith("/download/storage/v1/b"):
        return _json_route(method, path[22:], query)
    if path.startswith(_UPLOAD_PREFIX):
        return _upload_route(method, path[len(_UPLOAD_PREFIX) :], query)
    return _xml_route(method, path, query)


def _json_route(method: str, rest: str, query: Mapping[str, str]) -> Route:
    # rest is what follows "/storage/v1/b": "", "/{b}", "/{b}/o", "/{b}/o/{name}..."
    if rest in ("", "/"):
        if method == "POST":
            return Route("bucket_create", "bucket_create")
        return Route("bucket_list", "bucket_list")
    bucket, sep, tail = rest[1:].partition("/")
    bucket = unquote(bucket)
    if not sep:
        if method == "DELETE":
            return Route("bucket_delete", "bucket_delete", bucket)
        return Route("bucket_get", "bucket_get", bucket)
    if tail == "o" or tail == "o/":
        if method == "GET":
            return Route("list", "list", bucket, query.get("prefix", ""))
        return Route("put", "insert_metadata", bucket)
    if tail == "iam/testPermissions":
        return Route("iam", "iam", bucket)
    if not tail.startswith("o/"):
        return Route("unknown", "unknown", bucket)
    return _object_route(method, bucket, tail[2:], query)


def _object_route(method: str, bucket: str, obj: str, query: Mapping[str, str]) -> Route:
    # obj is what follows "/storage/v1/b/{bucket}/o/": "{name}", "{name}/compose"...
    if method == "POST":
        # objects.move: POST .../b/{bucket}/o/{source}/moveTo/o/{destination}
        # (https://cloud.google.com/storage/docs/json_api/v1/objects/move).
        idx = obj.find("/moveTo/o/")
        if idx >= 0:
            source, dest = unquote(obj[:idx]), unquote(obj[idx + 10 :])
            return Route("move", "move", bucket, source, bucket, dest)
    for marker, op in (("/rewriteTo/b/", "rewrite"), ("/copyTo/b/", "copy")):
        idx = obj.find(marker)
        if idx >= 0:
            dest_bucket, _, dest = obj[idx + len(marker) :].partition("/o/")
            return Route(
                "copy", op, bucket, unquote(obj[:idx]), unquote(dest_bucket), unquote(dest)
            )
    if obj.endswith("/compose") and method == "POST":
        return Route("compose", "compose", bucket, unquote(obj[:-8]))
    name = unquote(obj)
    if method == "GET":
        if query.get("alt") == "media":
            return Route("get", "media", bucket, name)
        return Route("head", "metadata", bucket, name)
    if method == "DELETE":
        return Route("delete", "delete", bucket, name)
    if method in ("PATCH", "PUT"):
        return Route("patch", "patch", bucket, name)
    return Route("unknown", "unknown", bucket, name)


def _upload_route(method: str, rest: str, query: Mapping[str, str]) -> Route:
    bucket = rest.partition("/")[0]
    bucket = unquote(bucket)
    name = query.get("name", "")
    if "upload_id" in query:
        return Route("resumable", "resumable_chunk", bucket, name)
    upload_type = query.get("uploadType", "media")
    if upload_type == "resumable":
        return Route("resumable", "resumable_start", bucket, name)
    if upload_type == "multipart":
        return Route("put", "upload_multipart", bucket, name)
    return Route("put", "upload_media", bucket, name)


def _xml_route(method: str, path: str, query: Mapping[str, str]) -> Route:
    bucket, sep, key = path[1:].partition("/")
    bucket = unquote(bucket)
    if not bucket:
        return Route("bucket_list", "unknown", xml=True)
    if not sep or not key:
        if method == "GET" and "uploads" in query:
            return Route("mpu_list", "mpu_list", bucket, query.get("prefix", ""), xml=True)
        if method == "GET":
            return Route("list", "xml_list", bucket, query.get("prefix", ""), xml=True)
        return Route("unknown", "unknown", bucket, xml=True)
    name = unquote(key)
    if method == "POST":
        if "uploads" in query:
            return Route("mpu_initiate", "mpu_initiate", bucket, name, xml=True)
        if "uploadId" in query:
            return Route("mpu_complete", "mpu_complete", bucket, name, xml=True)
        return Route("unknown", "unknown", bucket, name, xml=True)
    if method == "PUT":
        if "uploadId" in query:
            return Route("mpu_part", "mpu_part", bucket, name, xml=True)
        return Route("put", "xml_put", bucket, name, xml=True)
    if method == "DELETE":
        if "uploadId" in query:
            return Route("mpu_abort", "mpu_abort", bucket, name, xml=True)
        return Route("delete", "xml_delete", bucket, name, xml=True)
    if method == "HEAD":
        return Route("head", "xml_head", bucket, name, xml=True)
    if method == "GET":
        if "uploadId" in query:
            return Route("mpu_parts", "mpu_parts", bucket, name, xml=True)
        return Route("get", "xml_get", bucket, name, xml=True)
    return Route("unknown", "unknown", bucket, name, xml=True)
