"""The admin API under ``/_emulator/`` (JSON): faults, stats, latency, seeding.

Admin requests bypass the latency model, the rps cap, fault rules and counters.
In "auth required" mode each needs the emulator's admin secret, made at start,
in the ``x-emulator-admin-token`` header (401 without it, 403 with another):
GCS requests need a token there, so seeding, fault injection or key
registration must not be open either.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from torchbucket.emulator._faults import FaultRule
from torchbucket.emulator._http import ApiError, api_error_response, json_response
from torchbucket.emulator._latency import RateCap, resolve_latency
from torchbucket.emulator._names import checked_items
from torchbucket.emulator._ratemodel import rate_model_admin
from torchbucket.emulator._seed import decode_frames, generated_objects
from torchbucket.errors import ConfigError

if TYPE_CHECKING:
    from torchbucket.emulator._server import FrontServer

__all__ = ["ADMIN_TOKEN_HEADER", "admin_refused", "admin_token_ok", "handle_admin"]

#: The header that carries the admin secret in "auth required" mode.
ADMIN_TOKEN_HEADER = "x-emulator-admin-token"


def _ok(payload: Any) -> web.Response:
    return json_response(json.dumps(payload).encode())


async def _json(request: web.BaseRequest) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise ApiError(400, "admin request body is not valid JSON") from None


def admin_token_ok(request: web.BaseRequest, token: str) -> bool:
    """Whether ``request`` carries the admin secret ``token``."""
    sent = request.headers.get(ADMIN_TOKEN_HEADER, "")
    return secrets.compare_digest(sent.encode(), token.encode())


async def admin_refused(request: web.BaseRequest) -> web.Response:
    """The answer to an admin request without the right secret: 401, or 403 with a wrong one."""
    if request.body_exists and "Expect" not in request.headers:
        await request.read()  # so the connection can carry the next request
    if ADMIN_TOKEN_HEADER in request.headers:
        return api_error_response(
            ApiError(403, f"the {ADMIN_TOKEN_HEADER} header does not hold the admin secret")
        )
    return api_error_response(
        ApiError(
            401,
            f"the emulator requires auth: its admin API needs the {ADMIN_TOKEN_HEADER} header "
            "(the admin_token its start line printed)",
            reason="required",
        )
    )


async def handle_admin(front: FrontServer, request: web.BaseRequest, path: str) -> web.Response:
    """Answer one ``/_emulator/...`` request."""
    try:
        return await _dispatch(front, request, path[len("/_emulator/") :].rstrip("/"))
    except ApiError as exc:
        return api_error_response(exc)
    except ConfigError as exc:
        return api_error_response(ApiError(400, str(exc)))


async def _dispatch(front: FrontServer, request: web.BaseRequest, path: str) -> web.Response:
    """The endpoints about the server itself (stats, faults, latency, rates), else the rest."""
    method = request.method
    if path == "health":
        return _ok({"ok": True, "backend": front.backend.name, "port": front.port})
    if path == "stats":
        if method == "DELETE":
            front.stats.reset()
            return _ok({"ok": True})
        return _ok(front.stats.snapshot(front.backend.pid))
    if path == "stats/reset":
        front.stats.reset()
        return _ok({"ok": True})
    if path == "faults":
        if method == "DELETE":
            front.faults.clear()
            return _ok({"ok": True})
        if method == "POST":
            body = await _json(request)
            if not isinstance(body, dict):
                raise ApiError(400, "a fault rule is a JSON object")
            rule_id = front.faults.add(FaultRule.from_dict(body))
            return _ok({"id": rule_id})
        return _ok({"rules": [r.to_dict() for r in front.faults.rules]})
    if path == "latency":
        if method == "GET":
            model = front.latency
            return _ok({"latency": model.to_dict() if model is not None else None})
        body = await _json(request)
        front.latency = resolve_latency(body.get("latency") if isinstance(body, dict) else None)
        return _ok({"ok": True})
    if path == "rate_model":
        return await rate_model_admin(front, request)
    if path == "rps_cap":
        body = await _json(request)
        rps = body.get("rps") if isinstance(body, dict) else None
        front.rate_cap = RateCap(float(rps)) if rps else None
        return _ok({"ok": True})
    return await _dispatch_data(front, request, path)


async def _dispatch_data(front: FrontServer, request: web.BaseRequest, path: str) -> web.Response:
    """The endpoints about buckets and objects, and shutdown."""
    method = request.method
    if path == "buckets" and method == "POST":
        body = await _json(request)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(400, "bucket create needs a name")
        if body.get("zonal"):
            if getattr(front.backend, "store", None) is None:
                raise ApiError(501, f"the {front.backend.name} backend has no zonal buckets")
            await front.backend.create_bucket(name, zonal=True)  # type: ignore[call-arg]
        else:
            await front.backend.create_bucket(name)
        if body.get("soft_delete_seconds"):
            _set_soft_delete(front, name, body["soft_delete_seconds"])
        return _ok({"name": name})
    if path.startswith("soft_delete/") and method in ("PUT", "POST"):
        body = await _json(request)
        seconds = body.get("seconds") if isinstance(body, dict) else None
        _set_soft_delete(front, unquote(path[12:]), seconds)
        return _ok({"ok": True})
    if path.startswith("seed/") and method == "POST":
        return await _seed(front, request, unquote(path[5:]))
    if path.startswith("objects/"):
        prefix = request.query.get("prefix", "")
        names = await front.backend.object_names(unquote(path[8:]), prefix)
        return _ok({"names": names})
    if path == "uploads":
        return _ok({"count": len(front.xml.uploads)})
    if path == "shutdown" and method == "POST":
        front.stopped.set()
        return _ok({"ok": True})
    raise ApiError(404, f"no admin endpoint {method} /_emulator/{path}")


def _set_soft_delete(front: FrontServer, bucket: str, seconds: Any) -> None:
    """Set a model-store bucket's soft-delete retention (fake-gcs-server has none)."""
    setter = getattr(front.backend, "set_soft_delete", None)
    if setter is None:
        raise ApiError(501, f"the {front.backend.name} backend has no soft-delete policy")
    setter(bucket, seconds)


async def _seed(front: FrontServer, request: web.BaseRequest, bucket: str) -> web.Response:
    t0 = time.perf_counter()
    ctype = request.headers.get("Content-Type", "")
    if ctype.startswith("application/json"):
        spec = await _json(request)
        if not isinstance(spec, dict):
            raise ApiError(400, "a seed spec is a JSON object")
        if "objects" in spec:
            objects = spec["objects"]
            if not isinstance(objects, dict):
                raise ApiError(400, "seed objects must map names to base64 data")
            try:
                items: Any = [(k, base64.b64decode(v)) for k, v in objects.items()]
            except (binascii.Error, TypeError) as exc:
                raise ApiError(400, f"seed objects must be base64: {exc}") from exc
        else:
            items = generated_objects(spec)
    else:
        items = decode_frames(await request.read())
    # Checked before the store sees any: GCS could hold none of a bad name's objects.
    count = await front.backend.seed(bucket, list(checked_items(items)))
    return _ok({"count": count, "seconds": time.perf_counter() - t0})
