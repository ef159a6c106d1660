"""The GCS JSON API over the model store: the handlers behind the front server."""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from torchbucket.emulator._fields import parse_fields
from torchbucket.emulator._hashes import check_declared, declared_in_metadata
from torchbucket.emulator._http import (
    ASSEMBLED_HEADER,
    ApiError,
    Call,
    api_error_response,
    json_response,
    parse_range,
)
from torchbucket.emulator._model_store import (
    ModelObject,
    ModelStore,
    Preconditions,
    check_soft_delete,
)
from torchbucket.emulator._pieces import Pieces, PiecesPayload
from torchbucket.emulator._resumable import ResumableSessions, Session

__all__ = ["ModelBackend"]

_MAX_PAGE = 1000


class ModelBackend:
    """Serves the JSON API from a :class:`ModelStore` held in this process."""

    name = "model"
    pid: int | None = None

    def __init__(self) -> None:
        self.store = ModelStore()
        self.resumable = ResumableSessions(self._finalize, self._check_bucket)
        self._handlers: dict[str, Callable[[Call], Awaitable[web.Response]]] = {
            "media": self._media,
            "metadata": self._metadata,
            "list": self._list,
            "upload_media": self._upload_media,
            "upload_multipart": self._upload_multipart,
            "insert_metadata": self._insert_metadata,
            "resumable_start": self.resumable.start,
            "resumable_chunk": self.resumable.chunk,
            "compose": self._compose,
            "delete": self._delete,
            "rewrite": self._rewrite,
            "copy": self._copy,
            "move": self._move,
            "patch": self._patch,
            "bucket_create": self._bucket_create,
            "bucket_get": self._bucket_get,
            "bucket_list": self._bucket_list,
            "bucket_delete": self._bucket_delete,
        }

    async def start(self) -> None:
        """Nothing to start: the store lives in this process."""

    async def close(self) -> None:
        """Nothing to stop."""

    async def handle(self, call: Call) -> web.Response:
        """Answer one JSON API call."""
        handler = self._handlers.get(call.route.kind)
        if handler is None:
            return api_error_response(ApiError(404, f"Not Found: {call.method} {call.path_qs}"))
        try:
            return await handler(call)
        except ApiError as exc:
            return api_error_response(exc)

    # -- admin helpers -------------------------------------------------------

    async def seed(self, bucket: str, items: Iterable[tuple[str, bytes]]) -> int:
        """Bulk-load objects (no per-object HTTP)."""
        return self.store.seed(bucket, items)

    async def object_names(self, bucket: str, prefix: str) -> list[str]:
        """Every object name under ``prefix``, sorted."""
        keys = self.store.bucket(bucket).keys
        lo = bisect.bisect_left(keys, prefix)
        if not prefix:
            return keys[lo:]
        out = []
        for name in keys[lo:]:
            if not name.startswith(prefix):
                break
            out.append(name)
        return out

    async def create_bucket(self, name: str, *, zonal: bool = False) -> None:
        """Create a bucket, a zonal one with ``zonal`` (409 when it exists)."""
        self.store.create_bucket(name, zonal=zonal)

    def set_soft_delete(self, name: str, seconds: Any) -> None:
        """Set bucket ``name``'s soft-delete retention (0 turns it off)."""
        self.store.bucket(name).soft_delete_seconds = check_soft_delete(seconds)

    # -- reads ---------------------------------------------------------------

    async def _media(self, call: Call) -> web.Response:
        obj = self._read_target(call)
        headers = obj.media_headers()
        if obj.content_encoding:
            # https://cloud.google.com/storage/docs/transcoding: a gzip object
            # goes to a client that does not accept gzip decompressed, whole
            # (a Range is ignored), with no Content-Length and the stored
            # bytes' hashes; to one that does, as stored, Content-Encoding set.
            decoded = obj.decoded()
            if decoded is not None and not accepts_gzip(call.headers.get("Accept-Encoding")):
                resp = web.Response(body=decoded, headers=headers)
                resp.enable_chunked_encoding()
                return resp
            headers["Content-Encoding"] = obj.content_encoding
        rng = parse_range(call.headers.get("Range"), len(obj.data))
        if rng is None:
            data = obj.data
            body = data if isinstance(data, bytes) else PiecesPayload(data)  # sent as they are
            return web.Response(body=body, headers=headers)
        first, last = rng
        headers["Content-Range"] = f"bytes {first}-{last}/{len(obj.data)}"
        return web.Response(status=206, body=obj.data[first : last + 1], headers=headers)

    def _read_target(self, call: Call) -> ModelObject:
        q = call.query
        gen = q.get("generation")
        obj = self.store.get(call.route.bucket, call.route.name, int(gen) if gen else None)
        if "ifGenerationMatch" in q or "ifGenerationNotMatch" in q or "ifMetagenerationMatch" in q:
            Preconditions.from_query(q).check(obj, "object")
        return obj

    async def _metadata(self, call: Call) -> web.Response:
        return _object_response(call, self._read_target(call))

    async def _list(self, call: Call) -> web.Response:
        q = call.query
        try:
            max_results = min(int(q.get("maxResults", _MAX_PAGE)), _MAX_PAGE)
        except ValueError:
            raise ApiError(400, f"Invalid maxResults {q.get('maxResults')!r}") from None
        if max_results < 1:
            max_results = _MAX_PAGE
        items, prefixes, token = self.store.list_page(
            call.route.bucket,
            prefix=q.get("prefix", ""),
            start_offset=q.get("startOffset", ""),
            end_offset=q.get("endOffset", ""),
            page_token=q.get("pageToken", ""),
            max_results=max_results,
            delimiter=q.get("delimiter", ""),
        )
        mask = parse_fields(q.get("fields"))
        parts = [b'"kind":"storage#objects"'] if mask.wants("kind") else []
        if token is not None and mask.wants("nextPageToken"):
            parts.append(b'"nextPageToken":"' + token.encode() + b'"')
        if prefixes and mask.wants("prefixes"):
            parts.append(b'"prefixes":' + json.dumps(prefixes).encode())
        if items and mask.wants("items"):
            fields = mask.items
            parts.append(b'"items":[' + b",".join([o.resource(fields) for o in items]) + b"]")
        return json_response(b"{" + b",".join(parts) + b"}")

    # -- writes --------------------------------------------------------------

    def _put(
        self, call: Call, name: str, data: bytes | Pieces, meta: dict[str, Any], *, md5: bool = True
    ) -> web.Response:
        if not name:
            raise ApiError(400, "Required parameter 'name' is missing.")
        content_type = meta.get("contentType") or call.headers.get("Content-Type")
        self._check_hashes(meta, data)
        obj = self.store.put(
            call.route.bucket,
            name,
            data,
            content_type=content_type,
            metadata=meta.get("metadata"),
            pre=Preconditions.from_query(call.query),
            md5=md5,
            content_encoding=meta.get("contentEncoding"),
        )
        return _object_response(call, obj)

    @staticmethod
    def _check_hashes(meta: dict[str, Any], data: bytes | Pieces) -> None:
        # GCS refuses an upload whose declared crc32c / md5Hash does not match
        # what it received (see _hashes).
        check_declared(declared_in_metadata(meta), data)

    async def _upload_media(self, call: Call) -> web.Response:
        # A completed XML multipart upload: no MD5, as on GCS.
        md5 = ASSEMBLED_HEADER not in call.headers
        data = call.body if call.assembled is None else call.assembled
        return self._put(call, call.query.get("name", ""), data, {}, md5=md5)

    async def _insert_metadata(self, call: Call) -> web.Response:
        meta = _json_body(call)
        return self._put(call, call.query.get("name") or meta.get("name", ""), b"", meta)

    async def _upload_multipart(self, call: Call) -> web.Response:
        meta, data, media_type = parse_multipart_related(call)
        if media_type and not meta.get("contentType"):
            meta["contentType"] = media_type
        return self._put(call, meta.get("name") or call.query.get("name", ""), data, meta)

    async def _check_bucket(self, bucket: str) -> None:
        self.store.bucket(bucket)

    async def _finalize(self, session: Session, data: bytes | Pieces) -> web.Response:
        meta = session.meta
        self._check_hashes(meta, data)
        obj = self.store.put(
            session.bucket,
            session.name,
            data,
            content_type=meta.get("contentType"),
            metadata=meta.get("metadata"),
            pre=Preconditions.from_query(session.query),
            content_encoding=meta.get("contentEncoding"),
        )
        return json_response(obj.resource())

    async def _compose(self, call: Call) -> web.Response:
        body = _json_body(call)
        sources = body.get("sourceObjects")
        if not isinstance(sources, list):
            raise ApiError(400, "sourceObjects is required")
        dest = body.get("destination") or {}
        obj = self.store.compose(
            call.route.bucket,
            call.route.name,
            sources,
            dest.get("contentType"),
            Preconditions.from_query(call.query),
            dest.get("contentEncoding"),
        )
        return _object_response(call, obj)

    async def _delete(self, call: Call) -> web.Response:
        gen = call.query.get("generation")
        self.store.delete(
            call.route.bucket,
            call.route.name,
            int(gen) if gen else None,
            Preconditions.from_query(call.query),
        )
        return web.Response(status=204)

    def _copy_object(self, call: Call) -> ModelObject:
        route = call.route
        q = call.query
        gen = q.get("sourceGeneration")
        src = self.store.get(route.bucket, route.name, int(gen) if gen else None)
        Preconditions.from_query(q, "ifSource").check(src, "source object")
        meta = _json_body(call) if call.body else {}
        return self.store.put(
            route.bucket2,
            route.name2,
            src.data,
            content_type=meta.get("contentType") or src.content_type,
            metadata=meta.get("metadata", src.metadata),
            pre=Preconditions.from_query(q),
            content_encoding=meta.get("contentEncoding", src.content_encoding),
            # A rewrite within a bucket moves no data (one call, metadata only:
            # https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite),
            # so the copy shares the bytes and their checksums, costing no CPU.
            hashes=(src.crc32c, src.md5),
        )

    async def _rewrite(self, call: Call) -> web.Response:
        obj = self._copy_object(call)
        size = str(len(obj.data)).encode()
        return json_response(
            b'{"kind":"storage#rewriteResponse","totalBytesRewritten":"'
            + size
            + b'","objectSize":"'
            + size
            + b'","done":true,"resource":'
            + obj.resource()
            + b"}"
        )

    async def _copy(self, call: Call) -> web.Response:
        return _object_response(call, self._copy_object(call))

    async def _move(self, call: Call) -> web.Response:
        # objects.move answers with the destination's object resource
        # (https://cloud.google.com/storage/docs/json_api/v1/objects/move).
        route = call.route
        q = call.query
        gen = q.get("sourceGeneration")
        try:
            source_generation = int(gen) if gen else None
        except ValueError:
            raise ApiError(400, f"Invalid value for sourceGeneration: {gen!r}") from None
        obj = self.store.move(
            route.bucket,
            route.name,
            route.name2,
            source_generation=source_generation,
            source_pre=Preconditions.from_query(q, "ifSource"),
            pre=Preconditions.from_query(q),
        )
        return _object_response(call, obj)

    async def _patch(self, call: Call) -> web.Response:
        obj = self.store.get(call.route.bucket, call.route.name)
        Preconditions.from_query(call.query).check(obj, "object")
        meta = _json_body(call)
        if "contentType" in meta:
            obj.content_type = meta["contentType"] or "application/octet-stream"
        if "metadata" in meta:
            obj.metadata = meta["metadata"]
        if "contentEncoding" in meta:
            obj.content_encoding = meta["contentEncoding"] or None
        obj.metageneration += 1
        obj.invalidate()
        return json_response(obj.resource())

    # -- buckets -------------------------------------------------------------

    async def _bucket_create(self, call: Call) -> web.Response:
        body = _json_body(call)
        policy = body.get("softDeletePolicy") or {}
        seconds = check_soft_delete(policy.get("retentionDurationSeconds", 0))
        # A Rapid bucket is asked for by its storage class (it takes a zone as
        # its placement too: https://cloud.google.com/storage/docs/rapid/rapid-bucket).
        zonal = str(body.get("storageClass", "")).upper() == "RAPID"
        bucket = self.store.create_bucket(body.get("name", ""), zonal=zonal)
        bucket.soft_delete_seconds = seconds
        return json_response(json.dumps(bucket.resource()).encode())

    async def _bucket_get(self, call: Call) -> web.Response:
        return json_response(json.dumps(self.store.bucket(call.route.bucket).resource()).encode())

    async def _bucket_list(self, call: Call) -> web.Response:
        items = [b.resource() for b in self.store.buckets.values()]
        return json_response(json.dumps({"kind": "storage#buckets", "items": items}).encode())

    async def _bucket_delete(self, call: Call) -> web.Response:
        bucket = self.store.bucket(call.route.bucket)
        if bucket.objects:
            raise ApiError(409, f"The bucket you tried to delete is not empty: {bucket.name}")
        del self.store.buckets[bucket.name]
        await asyncio.sleep(0)
        return web.Response(status=204)


def _object_response(call: Call, obj: ModelObject) -> web.Response:
    """An object resource, narrowed to the call's ``fields`` mask."""
    fields = call.query.get("fields")
    if not fields:
        return json_response(obj.resource())
    return json_response(obj.resource(parse_fields(fields, collection=False).items))


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header accepts gzip (``gzip`` or ``*``, q > 0)."""
    for item in (accept_encoding or "").split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                if float(q[2:]) <= 0:
                    continue
            except ValueError:
                continue
        return True
    return False


def _json_body(call: Call) -> dict[str, Any]:
    if not call.body:
        return {}
    try:
        data = json.loads(call.body)
    except ValueError:
        raise ApiError(400, "Request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    return data


def parse_multipart_related(call: Call) -> tuple[dict[str, Any], bytes, str | None]:
    """Split a ``multipart/related`` upload into its JSON metadata and media.

    Returns:
        ``(metadata, media bytes, media content type or None)``.
    """
    ctype = call.headers.get("Content-Type", "")
    boundary = ""
    for param in ctype.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary":
            boundary = value.strip().strip('"')
    if not boundary:
        raise ApiError(400, "multipart upload without a boundary")
    delim = b"--" + boundary.encode()
    body = call.body
    pieces = body.split(delim)
    # pieces: preamble, part1, part2, ..., "--" epilogue
    parts = [p for p in pieces[1:] if not p.startswith(b"--")]
    if len(parts) < 2:
        raise ApiError(400, "multipart upload needs a metadata part and a media part")

    # Lines end in CRLF (RFC 2046) or, from some clients (gcsfs), in a bare LF,
    # which GCS accepts too: the first part's delimiter line says which.
    eol = b"\n" if parts[0].startswith(b"\n") else b"\r\n"

    def split_part(part: bytes) -> tuple[dict[str, str], bytes]:
        if part.startswith(eol):
            part = part[len(eol) :]
        head, sep, content = part.partition(eol + eol)
        if not sep:
            raise ApiError(400, "malformed multipart part")
        if content.endswith(eol):  # the line break before a delimiter is the delimiter's
            content = content[: -len(eol)]
        headers = {}
        for line in head.decode("latin-1").split(eol.decode()):
            k, _, v = line.partition(":")
            if k:
                headers[k.strip().lower()] = v.strip()
        return headers, content

    _, meta_bytes = split_part(parts[0])
    media_headers, media = split_part(parts[1])
    try:
        meta = json.loads(meta_bytes) if meta_bytes.strip() else {}
    except ValueError:
        raise ApiError(400, "multipart metadata part is not valid JSON") from None
    return meta, media, media_headers.get("content-type")
