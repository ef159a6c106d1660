"""Preconditions that fake-gcs-server ignores, checked by the front server.

fake-gcs-server ignores generation preconditions on uploads, compose, reads,
deletes and copies, answers a compose of a missing source with 500,
deletes the live object whatever ``generation`` says, and has no
``objects.move`` (served here as a copy and a delete: :meth:`PreconditionShim.move`). Before forwarding
such a call, the proxy reads the objects' current generations and answers the
way GCS would (404 or 412). The check and the call are not atomic, which is
good enough for tests at small scale; the model store is exact.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web
from multidict import CIMultiDict

from torchbucket.emulator._http import ApiError, Call, Route, json_call
from torchbucket.emulator._model_store import MAX_COMPOSE_SOURCES

__all__ = ["PreconditionShim"]

Forward = Callable[[Call], Awaitable[web.Response]]


def _int(value: Any, what: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ApiError(400, f"Invalid value for {what}: {value!r}") from None


def _check(current: int | None, query: Any, prefix: str, what: str) -> None:
    """GCS's ``if*GenerationMatch`` checks against ``current`` (None: missing)."""
    gen = current or 0
    match = _int(query.get(f"{prefix}GenerationMatch"), f"{prefix}GenerationMatch")
    if match is not None and match != gen:
        raise ApiError(
            412,
            f"At least one of the pre-conditions you specified did not hold "
            f"({prefix}GenerationMatch={match}, {what} generation {gen}).",
        )
    not_match = _int(query.get(f"{prefix}GenerationNotMatch"), f"{prefix}GenerationNotMatch")
    if not_match is not None and not_match == gen:
        raise ApiError(412, f"{what} generation is {gen} ({prefix}GenerationNotMatch)")


def _multipart_name(call: Call) -> str:
    from torchbucket.emulator._model_api import parse_multipart_related

    meta = parse_multipart_related(call)[0]
    return str(meta.get("name", ""))


def check_generation(current: int | None, query: Any, what: str = "live object") -> None:
    """Raise 412 where ``query``'s ``ifGeneration*`` fails against ``current``."""
    _check(current, query, "if", what)


class PreconditionShim:
    """Checks a call's preconditions through metadata reads before forwarding.

    Args:
        forward: Sends a call to fake-gcs-server.
    """

    def __init__(self, forward: Forward) -> None:
        self.forward = forward

    async def generation(self, bucket: str, name: str, host: str) -> int | None:
        """The live generation of ``bucket/name``, or ``None`` when missing."""
        resp = await self.forward(json_call("GET", "metadata", bucket, name, host=host))
        if resp.status == 404:
            return None
        if resp.status >= 400:
            raise ApiError(resp.status, f"metadata read of {bucket}/{name} failed")
        return int(json.loads(bytes(resp.body))["generation"])  # type: ignore[arg-type]

    async def check(self, call: Call) -> None:
        """Raise :class:`ApiError` where GCS would refuse ``call``."""
        kind = call.route.kind
        q = call.query
        if kind in ("media", "metadata", "delete", "patch"):
            if not any(k in q for k in ("generation", "ifGenerationMatch", "ifGenerationNotMatch")):
                return
            route = call.route
            gen = await self.generation(route.bucket, route.name, call.host)
            wanted = _int(q.get("generation"), "generation")
            if gen is None or (wanted is not None and wanted != gen):
                raise ApiError(404, f"No such object: {route.bucket}/{route.name}")
            _check(gen, q, "if", "live object")
        elif kind == "compose":
            await self._compose(call)
        elif kind in ("rewrite", "copy"):
            route = call.route
            src = await self.generation(route.bucket, route.name, call.host)
            wanted = _int(q.get("sourceGeneration"), "sourceGeneration")
            if src is None or (wanted is not None and wanted != src):
                raise ApiError(404, f"No such object: {route.bucket}/{route.name}")
            _check(src, q, "ifSource", "source object")
            if "ifGenerationMatch" in q or "ifGenerationNotMatch" in q:
                dst = await self.generation(route.bucket2, route.name2, call.host)
                _check(dst, q, "if", "destination object")
        elif kind in ("upload_media", "upload_multipart") and (
            "ifGenerationMatch" in q or "ifGenerationNotMatch" in q
        ):
            name = call.route.name or _multipart_name(call)
            gen = await self.generation(call.route.bucket, name, call.host)
            _check(gen, q, "if", "live object")

    async def move(self, call: Call) -> web.Response:
        """``objects.move`` as a copy and a delete: fake-gcs-server has no ``moveTo``.

        GCS moves atomically
        (https://cloud.google.com/storage/docs/json_api/v1/objects/move); this
        cannot: between the copy and the delete a reader sees both names. It is
        still no kinder than GCS (a client sees more, never less, than on GCS),
        the preconditions are checked as GCS checks them (source 404, source and
        destination generation 412, equal names 400), and a failed delete
        removes the copy again, so a failed move leaves the source where it was
        (a destination it replaced is gone: fake-gcs-server keeps no versions).
        The model store's move is atomic; use it where that matters.
        """
        route, q, host = call.route, call.query, call.host
        if route.name == route.name2:
            raise ApiError(
                400,
                f"The source and destination object names must differ: {route.bucket}/{route.name}",
            )
        src = await self.generation(route.bucket, route.name, host)
        wanted = _int(q.get("sourceGeneration"), "sourceGeneration")
        if src is None or (wanted is not None and wanted != src):
            raise ApiError(404, f"No such object: {route.bucket}/{route.name}")
        _check(src, q, "ifSource", "source object")
        if "ifGenerationMatch" in q or "ifGenerationNotMatch" in q:
            dst = await self.generation(route.bucket, route.name2, host)
            _check(dst, q, "if", "destination object")
        qb = quote(route.bucket, safe="")
        path = f"/storage/v1/b/{qb}/o/{quote(route.name, safe='')}/copyTo/b/{qb}/o/"
        copy = Call(
            "POST",
            Route("copy", "copy", route.bucket, route.name, route.bucket, route.name2),
            path + quote(route.name2, safe=""),
            {},
            CIMultiDict({"Host": host, "Content-Type": "application/json"}),
            b"{}",
            host,
        )
        copied = await self.forward(copy)
        if copied.status >= 400:
            return copied
        deleted = await self.forward(
            json_call("DELETE", "delete", route.bucket, route.name, host=host)
        )
        if deleted.status >= 400 and deleted.status != 404:
            await self.forward(json_call("DELETE", "delete", route.bucket, route.name2, host=host))
            return deleted
        return copied

    async def _compose(self, call: Call) -> None:
        try:
            body = json.loads(call.body or b"{}")
        except ValueError:
            raise ApiError(400, "Request body is not valid JSON.") from None
        sources = body.get("sourceObjects") if isinstance(body, dict) else None
        if not isinstance(sources, list) or not sources:
            raise ApiError(400, "Compose requires at least one source object.")
        if len(sources) > MAX_COMPOSE_SOURCES:
            raise ApiError(
                400,
                f"The number of source components provided ({len(sources)}) exceeds "
                f"the maximum ({MAX_COMPOSE_SOURCES}).",
            )
        route = call.route
        for src in sources:
            name = src.get("name") if isinstance(src, dict) else None
            if not isinstance(name, str) or not name:
                raise ApiError(400, "Every source object needs a name.")
            gen = await self.generation(route.bucket, name, call.host)
            pinned = _int(src.get("generation"), "generation")
            if gen is None or (pinned is not None and pinned != gen):
                raise ApiError(404, f"Source object {route.bucket}/{name} not found.")
            match = (src.get("objectPreconditions") or {}).get("ifGenerationMatch")
            if match is not None and _int(match, "ifGenerationMatch") != gen:
                raise ApiError(412, f"Source object {name} generation {gen} != {match}.")
        if "ifGenerationMatch" in call.query or "ifGenerationNotMatch" in call.query:
            dst = await self.generation(route.bucket, route.name, call.host)
            _check(dst, call.query, "if", "destination object")
