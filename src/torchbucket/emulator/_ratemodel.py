"""A model of GCS's request-rate behaviour: capacity that starts low and doubles.

GCS documents (https://cloud.google.com/storage/docs/request-rate, read
2026-12-05):

- a bucket starts with "an initial IO capacity of around 1000 object write
  requests per second and 5000 object read requests per second";
- it scales up by redistributing its key range when request rates are
  sustained (the load needs time to be noticed and the range split);
- clients should "double the request rate no faster than every 20 minutes"
  and spread load over the key range: sequential names (timestamps, counters)
  put every request in one key range where hashed names spread them;
- above what the bucket serves now it answers 429 (too many requests) and,
  for "a sudden increase in request rate", 503 (service unavailable).

The model (:class:`RequestRateModel`, one per server, opt-in): per class
(reads: object and metadata reads; writes: everything else that is not a
listing... see :func:`rate_class`) a capacity in requests per second, enforced
as a token bucket holding ``burst`` seconds of it. Load is counted in windows
of ``window`` seconds: a window whose admitted requests reach ``near`` of the
capacity extends a run of sustained load; after ``double_after`` seconds of
such windows the capacity doubles (up to ``ceiling`` times the start). A
refused request is answered 429, or 503 while the window's offered load
(refused ones included) is above ``jump_factor`` times the capacity. With
``key_ranges = K > 1`` the key space is cut into K ranges by the first two
characters of the name, each with 1/K of the capacity, doubling on its own.

Which of these figures GCS really uses is not published beyond the initial
rates and the 20-minute guidance; ``near``, ``jump_factor``, ``burst`` and
the window are this model's choices. :data:`RATE_PRESETS` holds GCS's figures
(``"gcs"``) and a copy scaled down to bite on a small machine
(``"gcs-scaled"``: 150 reads/s and 30 writes/s, doubling after 8 s near
capacity, at most 4x).

The state (:class:`RateState`) takes its clock as an argument, so the same
code serves the emulator (``time.monotonic``) and a simulation's clock
(``benchmarks/scale_sim.py``), and admits one request or many at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from torchbucket.emulator._http import ApiError, json_response
from torchbucket.errors import ConfigError

if TYPE_CHECKING:
    from aiohttp import web

    from torchbucket.emulator._server import FrontServer

__all__ = [
    "RATE_PRESETS",
    "RateState",
    "RequestRateModel",
    "rate_class",
    "rate_model_admin",
    "rate_model_arg",
    "resolve_rate_model",
]

# Operations that GCS counts as object reads; the rest of the data path
# (writes, compose, copy, deletes, multipart) as writes. Listings and bucket
# operations are left out of the model (GCS states no per-bucket figure).
_READ_OPS = frozenset({"get", "head"})
_UNMODELLED = frozenset({"list", "mpu_list", "bucket_list", "bucket_get", "iam"})
_UNMODELLED |= frozenset({"bucket_create", "bucket_delete"})
_PRINTABLE = 95  # characters 0x20..0x7e


def rate_class(op: str) -> str | None:
    """``"read"``, ``"write"`` or ``None`` (not modelled) for an emulator operation."""
    if op in _READ_OPS:
        return "read"
    if op in _UNMODELLED:
        return None
    return "write"


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestRateModel:
    """A bucket's request capacity per class, growing under sustained load.

    Attributes:
        read_rate: Initial object reads per second. Default 5,000 (GCS).
        write_rate: Initial object writes per second. Default 1,000 (GCS).
        double_after: Seconds of sustained load near capacity before the
            capacity doubles. Default 1,200 (GCS's 20-minute guidance).
        near: Fraction of the capacity a window's admitted load must reach to
            count as sustained. Default 0.8.
        ceiling: Largest capacity as a multiple of the initial one, or
            ``None`` for no limit. Default ``None``.
        jump_factor: Offered load (refused requests included) above this
            multiple of the capacity within a window is answered 503 instead
            of 429. Default 2.0.
        burst: Seconds of capacity the token bucket holds. Default 0.2.
        window: Seconds per load window. Default 1.0.
        key_ranges: Key ranges, each with an equal share of the capacity
            (names ranked by their first two characters). Default 1.
    """

    read_rate: float = 5000.0
    write_rate: float = 1000.0
    double_after: float = 1200.0
    near: float = 0.8
    ceiling: float | None = None
    jump_factor: float = 2.0
    burst: float = 0.2
    window: float = 1.0
    key_ranges: int = 1

    def __post_init__(self) -> None:
        for name in ("read_rate", "write_rate", "double_after", "burst", "window"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"RequestRateModel.{name} must be > 0, got {getattr(self, name)!r}"
                )
        if not 0.0 < self.near <= 1.0:
            raise ConfigError(f"RequestRateModel.near must be in (0, 1], got {self.near!r}")
        if self.ceiling is not None and self.ceiling < 1.0:
            raise ConfigError(f"RequestRateModel.ceiling must be >= 1, got {self.ceiling!r}")
        if self.jump_factor < 1.0:
            raise ConfigError(
                f"RequestRateModel.jump_factor must be >= 1, got {self.jump_factor!r}"
            )
        if not 1 <= self.key_ranges <= 1024:
            raise ConfigError(
                f"RequestRateModel.key_ranges must be in [1, 1024], got {self.key_ranges!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The model as JSON-able fields (the admin API's wire form)."""
        return asdict(self)


#: ``"gcs"``: GCS's documented starting rates and ramp guidance;
#: ``"gcs-scaled"``: the same shape scaled to a 2-core machine (150 reads/s,
#: 30 writes/s, doubling after 8 s near capacity, at most 4x).
RATE_PRESETS: dict[str, RequestRateModel] = {
    "gcs": RequestRateModel(),
    "gcs-scaled": RequestRateModel(read_rate=150.0, write_rate=30.0, double_after=8.0, ceiling=4.0),
}


def resolve_rate_model(
    model: str | RequestRateModel | dict[str, Any] | None,
) -> RequestRateModel | None:
    """A preset name, a model, its dict form or ``None`` as a model (or ``None``).

    Raises:
        ConfigError: Unknown preset or bad fields.
    """
    if model is None or isinstance(model, RequestRateModel):
        return model
    if isinstance(model, str):
        if model in ("", "none"):
            return None
        if model not in RATE_PRESETS:
            raise ConfigError(
                f"unknown rate model {model!r}; known: {sorted(RATE_PRESETS)} or 'none'"
            )
        return RATE_PRESETS[model]
    if isinstance(model, dict):
        try:
            return RequestRateModel(**model)
        except TypeError as exc:
            raise ConfigError(f"bad rate model fields {sorted(model)}: {exc}") from exc
    raise ConfigError(f"rate model must be None, a preset name or a model, got {model!r}")


class _Range:
    """One key range of one class: its token bucket and load windows."""

    __slots__ = (
        "admitted",
        "capacity",
        "last",
        "offered",
        "r429",
        "r503",
        "start",
        "sustained",
        "tokens",
    )

    def __init__(self, capacity: float, burst: float, now: float) -> None:
        self.capacity = capacity
        self.tokens = capacity * burst
        self.last = now
        self.start = now  # of the current window
        self.admitted = 0
        self.offered = 0
        self.r429 = 0
        self.r503 = 0
        self.sustained = 0.0


class RateState:
    """The request-rate model in force: per class and key range, capacity and load.

    Args:
        model: The parameters.
        clock: Seconds, monotonic (``time.monotonic`` by default; a simulation
            passes its own).
        keep: Load windows kept in the timeline per class.
    """

    def __init__(
        self,
        model: RequestRateModel,
        clock: Callable[[], float] = time.monotonic,
        keep: int = 7200,
    ) -> None:
        self.model = model
        self._clock = clock
        self._keep = keep
        now = clock()
        self.t0 = now
        k = model.key_ranges
        self._ranges = {
            "read": [_Range(model.read_rate / k, model.burst, now) for _ in range(k)],
            "write": [_Range(model.write_rate / k, model.burst, now) for _ in range(k)],
        }
        self._initial = {"read": model.read_rate / k, "write": model.write_rate / k}
        #: Per class, one entry per closed window: ``[end (s since start),
        #: admitted, answered 429, answered 503, capacity at its end (req/s)]``.
        self.timeline: dict[str, list[list[float]]] = {"read": [], "write": []}

    def key_range(self, name: str) -> int:
        """The key range of an object name (its first two characters' rank)."""
        k = self.model.key_ranges
        if k == 1:
            return 0
        a = min(max(ord(name[0]) - 32, 0), _PRINTABLE - 1) if name else 0
        b = min(max(ord(name[1]) - 32, 0), _PRINTABLE - 1) if len(name) > 1 else 0
        return (a * _PRINTABLE + b) * k // (_PRINTABLE * _PRINTABLE)

    def capacity(self, cls: str) -> float:
        """The class's capacity now, requests per second (all key ranges)."""
        self._roll(cls, self._clock())
        return sum(r.capacity for r in self._ranges[cls])

    def check(self, op: str, name: str = "") -> int:
        """Admit one request of ``op`` on object ``name``: 0, or the status to refuse it with."""
        cls = rate_class(op)
        if cls is None:
            return 0
        ok, r429, _ = self.admit(cls, 1, self.key_range(name) if name else 0)
        return 0 if ok else (429 if r429 else 503)

    def admit(self, cls: str, n: int, key_range: int = 0) -> tuple[int, int, int]:
        """Offer ``n`` requests of ``cls`` at once; return (admitted, 429s, 503s)."""
        now = self._clock()
        self._roll(cls, now)
        r = self._ranges[cls][key_range]
        model = self.model
        r.tokens = min(r.capacity * model.burst, r.tokens + (now - r.last) * r.capacity)
        r.last = now
        ok = min(n, int(r.tokens))
        r.tokens -= ok
        r.admitted += ok
        refused = n - ok
        # Offered load so far in this window, against what a sudden jump is.
        jump = model.jump_factor * r.capacity * model.window
        over = max(0, min(refused, r.offered + n - int(jump)))
        r.offered += n
        r.r503 += over
        r.r429 += refused - over
        return ok, refused - over, over

    def _roll(self, cls: str, now: float) -> None:
        """Close the windows of ``cls`` that ended by ``now``: doubling and the timeline."""
        model = self.model
        ranges = self._ranges[cls]
        first = ranges[0]
        if now - first.start < model.window:
            return
        while now - first.start >= model.window:
            end = first.start + model.window
            totals = [0.0, 0.0, 0.0]
            for r in ranges:
                totals[0] += r.admitted
                totals[1] += r.r429
                totals[2] += r.r503
                if r.admitted >= model.near * r.capacity * model.window:
                    r.sustained += model.window
                else:
                    r.sustained = 0.0
                if r.sustained >= model.double_after - 1e-9:
                    r.sustained = 0.0
                    cap = r.capacity * 2
                    if model.ceiling is not None:
                        cap = min(cap, self._initial[cls] * model.ceiling)
                    r.capacity = cap
                r.start = end
                r.admitted = r.offered = r.r429 = r.r503 = 0
            line = self.timeline[cls]
            line.append([round(end - self.t0, 6), *totals, sum(r.capacity for r in ranges)])
            if len(line) > self._keep:
                del line[: len(line) - self._keep]

    def snapshot(self) -> dict[str, Any]:
        """The model, each class's capacity now and its timeline of closed windows."""
        now = self._clock()
        out: dict[str, Any] = {"model": self.model.to_dict(), "elapsed": now - self.t0}
        for cls in ("read", "write"):
            self._roll(cls, now)
            out[cls] = {
                "capacity": sum(r.capacity for r in self._ranges[cls]),
                "timeline": list(self.timeline[cls]),
            }
        return out


def rate_model_arg(text: str) -> RequestRateModel | None:
    """The command line's ``--rate-model``: a preset name, ``none`` or JSON fields."""
    if text.lstrip().startswith("{"):
        return resolve_rate_model(json.loads(text))
    return resolve_rate_model(text)


async def rate_model_admin(front: FrontServer, request: web.BaseRequest) -> web.Response:
    """``/_emulator/rate_model``: GET the state (or ``null``); POST ``{"model": ...}``.

    A POST installs the model cold (initial capacity, empty timeline); a
    ``null`` model removes it.
    """
    if request.method == "POST":
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            raise ApiError(400, "admin request body is not valid JSON") from None
        model = resolve_rate_model(body.get("model") if isinstance(body, dict) else None)
        front.rate_model = RateState(model) if model is not None else None
        return json_response(b'{"ok": true}')
    state = front.rate_model
    return json_response(json.dumps(state.snapshot() if state is not None else None).encode())
