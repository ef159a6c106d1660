"""The object names GCS refuses, refused by the front server for both stores.

GCS's rules (https://cloud.google.com/storage/docs/objects#naming): a name is
1-1,024 bytes of UTF-8, holds no carriage return or line feed, does not start
with ``.well-known/acme-challenge/`` and is not ``.`` or ``..``. A NUL is
refused too. GCS answers a write to such a name with 400, reason ``invalid``;
neither the model store nor fake-gcs-server checks, so the front server does,
for every request that names a new object: uploads (media, multipart,
resumable, metadata-only), the XML API's PUT and multipart initiate, and the
destination of compose, copy, rewrite and move. Seeding through the admin API
is held to the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from torchbucket.emulator._http import ApiError, Call

__all__ = ["MAX_NAME_BYTES", "checked_items", "name_problem", "written_name"]

#: GCS's limit on an object name, in bytes of UTF-8.
MAX_NAME_BYTES = 1024
_ACME = ".well-known/acme-challenge/"
_FORBIDDEN = {"\r": "a carriage return", "\n": "a line feed", "\x00": "a NUL"}
# Route kinds whose route.name is the object written.
_NAMED_KINDS = frozenset({"upload_media", "compose", "xml_put", "mpu_initiate"})
# Route kinds whose route.name2 (the destination) is the object written.
_DEST_KINDS = frozenset({"copy", "rewrite", "move"})


def name_problem(name: str) -> str | None:
    """Why GCS refuses ``name`` as an object name, or ``None`` if it does not."""
    if not name:
        return "Required parameter 'name' is missing: an object name is 1-1,024 bytes."
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return f"The object name {name!r} is not valid UTF-8."
    if size > MAX_NAME_BYTES:
        return (
            f"The maximum object name length is {MAX_NAME_BYTES} bytes of UTF-8, "
            f"but got a name of {size} bytes: {name[:64]!r}..."
        )
    for char, what in _FORBIDDEN.items():
        if char in name:
            return f"The object name {name!r} is not valid: it contains {what}."
    if name in (".", ".."):
        return f"The object name {name!r} is not valid: an object cannot be named . or .."
    if name.startswith(_ACME):
        return f"The object name {name!r} is not valid: it starts with {_ACME}"
    return None


def written_name(call: Call) -> str | None:
    """The name of the object ``call`` would write, or ``None`` if it writes none.

    The JSON API takes the name where the store takes it: a multipart
    upload's and a resumable start's metadata first, then the ``name``
    parameter; a metadata-only insert the other way round. A body that does
    not parse gives ``None``: the store answers it with its own 400.
    """
    route = call.route
    kind = route.kind
    if kind in _NAMED_KINDS:
        return route.name
    if kind in _DEST_KINDS:
        return route.name2
    query_name = call.query.get("name", "")
    if kind == "upload_multipart":
        meta = _multipart_metadata(call)
        return None if meta is None else str(meta.get("name") or query_name)
    if kind == "resumable_start":
        meta = _json_object(call.body) if call.body else {}
        return None if meta is None else str(meta.get("name") or query_name)
    if kind == "insert_metadata":
        meta = _json_object(call.body) if call.body else {}
        return None if meta is None else str(query_name or meta.get("name", ""))
    return None


def checked_items(items: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    """``items`` for a seed, raising :class:`ApiError` (400) at a name GCS refuses."""
    for name, data in items:
        problem = name_problem(name)
        if problem is not None:
            raise ApiError(400, f"seed: {problem}")
        yield name, data


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _multipart_metadata(call: Call) -> dict[str, Any] | None:
    """The JSON metadata part of a ``multipart/related`` upload, read without
    scanning the media part (which may be large)."""
    boundary = ""
    for param in call.headers.get("Content-Type", "").split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary":
            boundary = value.strip().strip('"')
    if not boundary:
        return None
    body = call.body
    delim = b"--" + boundary.encode()
    start = body.find(delim)
    if start < 0:
        return None
    start += len(delim)
    end = body.find(delim, start)
    if end < 0:
        return None
    part = body[start:end]
    for eol in (b"\r\n\r\n", b"\n\n"):
        _head, sep, content = part.partition(eol)
        if sep:
            return _json_object(content.strip()) if content.strip() else {}
    return None
