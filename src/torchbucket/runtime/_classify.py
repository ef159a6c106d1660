"""Which GCS operation a request is, from its method, path and query.

The client's request accounting (:mod:`torchbucket.runtime.accounting`) names
each request it sends by the operations of :mod:`torchbucket._opclass`. The
emulator parses requests on its own (``emulator/_routes.py``): a test checks
that both name each request alike (``tests/unit/test_opclass.py``).
"""

from __future__ import annotations

__all__ = ["classify"]


def classify(method: str, path: str, query: str) -> str:
    """The operation of a GCS JSON or XML API request (the emulator's names).

    Args:
        method: HTTP method, upper case.
        path: The raw (percent-encoded) URL path.
        query: The raw query string.
    """
    i = path.find("/storage/v1/b")
    if i >= 0:
        return _json_op(method, path, query, i)
    return _xml_op(method, path, query)


def _json_op(method: str, path: str, query: str, i: int) -> str:
    """:func:`classify` of a JSON API request, ``/storage/v1/b`` at ``path[i:]``."""
    upload = path.startswith("/upload", max(0, i - 7)) and i >= 7
    if upload:
        if "upload_id=" in query or "uploadType=resumable" in query:
            return "resumable"
        return "put"
    rest = path[i + 13 :]
    if rest in ("", "/"):
        return "bucket_create" if method == "POST" else "bucket_list"
    tail = rest[1:].partition("/")[2]
    if not tail:
        return "bucket_delete" if method == "DELETE" else "bucket_get"
    if tail in ("o", "o/"):
        return "list" if method == "GET" else "put"
    if tail == "iam/testPermissions":
        return "iam"
    if "/rewriteTo/b/" in tail or "/copyTo/b/" in tail:
        return "copy"
    if "/moveTo/o/" in tail:
        return "move"
    if method == "POST" and tail.endswith("/compose"):
        return "compose"
    if method == "GET":
        return "get" if "alt=media" in query else "head"
    if method == "DELETE":
        return "delete"
    return "patch"


def _xml_op(method: str, path: str, query: str) -> str:
    """:func:`classify` of an XML API request: ``/{bucket}`` or ``/{bucket}/{object}``."""
    has_key = bool(path[1:].partition("/")[2])
    if "uploadId=" in query:
        if method == "PUT":
            return "mpu_part"
        if method == "POST":
            return "mpu_complete"
        if method == "DELETE":
            return "mpu_abort"
        return "mpu_parts"
    if any(part == "uploads" or part.startswith("uploads=") for part in query.split("&")):
        return "mpu_initiate" if method == "POST" else "mpu_list"
    if not has_key:
        return "list" if method == "GET" else "bucket_create"
    if method == "GET":
        return "get"
    if method == "HEAD":
        return "head"
    if method == "DELETE":
        return "delete"
    return "put"
