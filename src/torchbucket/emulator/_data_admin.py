"""The ``Emulator`` handle's admin calls on buckets, objects, faults and stats.

Mixed into :class:`torchbucket.emulator.Emulator`, which sends each call to the
front server's ``/_emulator/`` admin API (:mod:`torchbucket.emulator._admin`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from torchbucket.emulator._faults import FaultRule
from torchbucket.emulator._latency import LatencyModel, resolve_latency
from torchbucket.emulator._ratemodel import RequestRateModel, resolve_rate_model
from torchbucket.emulator._seed import encode_frames
from torchbucket.errors import ConfigError

__all__ = ["DataAdmin"]

# Seed requests carry at most this many bytes each.
_SEED_BATCH_BYTES = 64 << 20


class DataAdmin:
    """Methods of :class:`~torchbucket.emulator.Emulator` on the server's data and knobs."""

    faults_active: bool
    rps_cap: float | None
    _latency: LatencyModel | None

    if TYPE_CHECKING:

        def _admin(
            self,
            method: str,
            path: str,
            payload: Any = None,
            *,
            data: bytes | None = None,
            content_type: str = "application/json",
            timeout: float = 300.0,
        ) -> Any: ...

    def create_bucket(
        self, name: str, *, soft_delete_seconds: int = 0, zonal: bool = False
    ) -> None:
        """Create bucket ``name``.

        Args:
            name: The bucket.
            soft_delete_seconds: Its soft-delete retention (model store only):
                0 (off, the default here) or 7 to 90 days, as on GCS, where
                buckets are created with 7 days unless told otherwise.
            zonal: A zonal (Rapid) bucket (model store only): appendable
                objects over gRPC, storage layout "zone" with hierarchical
                namespace, and no compose, rewrite or XML multipart upload.
                Default ``False``.

        Raises:
            StorageError: It exists already (status 409), or ``zonal`` on
                fake-gcs-server (501).
            ConfigError: The retention is not one GCS accepts.
        """
        body: dict[str, Any] = {"name": name}
        if zonal:
            body["zonal"] = True
        if soft_delete_seconds:
            body["soft_delete_seconds"] = soft_delete_seconds
        self._admin("POST", "buckets", body)

    def set_soft_delete(self, bucket: str, seconds: int) -> None:
        """Set ``bucket``'s soft-delete retention in seconds; 0 turns it off.

        Raises:
            ConfigError: Not 0 or 7 to 90 days.
            StorageError: The backend is fake-gcs-server, which has no such
                policy (501).
        """
        self._admin(
            "PUT", f"soft_delete/{urllib.parse.quote(bucket, safe='')}", {"seconds": seconds}
        )

    def seed(self, bucket: str, objects: Mapping[str, bytes] | Iterable[tuple[str, bytes]]) -> int:
        """Bulk-load objects into ``bucket`` (fast on the model store).

        Args:
            bucket: An existing bucket.
            objects: Names and contents.

        Returns:
            How many objects were written.
        """
        items = objects.items() if isinstance(objects, Mapping) else objects
        total = 0
        batch: list[tuple[str, bytes]] = []
        size = 0
        quoted = urllib.parse.quote(bucket, safe="")
        for name, data in items:
            batch.append((name, data))
            size += len(name) + len(data) + 12
            if size >= _SEED_BATCH_BYTES:
                total += self._seed_frames(quoted, batch)
                batch, size = [], 0
        if batch:
            total += self._seed_frames(quoted, batch)
        return total

    def _seed_frames(self, quoted_bucket: str, batch: list[tuple[str, bytes]]) -> int:
        body = encode_frames(batch)
        result = self._admin(
            "POST", f"seed/{quoted_bucket}", data=body, content_type="application/octet-stream"
        )
        return int(result["count"])

    def seed_generated(
        self,
        bucket: str,
        *,
        count: int,
        size: int,
        prefix: str = "",
        names: Literal["sequential", "hashed"] = "sequential",
        seed: int = 0,
    ) -> float:
        """Have the server generate ``count`` objects of ``size`` bytes.

        Names are ``prefix`` plus a zero-padded index (``"sequential"``) or a
        hash (``"hashed"``), see :func:`generated_names`; contents are
        :func:`generated_bytes` of each name, so a reader can check them.

        Returns:
            Seconds the server spent seeding.
        """
        spec = {"prefix": prefix, "count": count, "size": size, "names": names, "seed": seed}
        result = self._admin("POST", f"seed/{urllib.parse.quote(bucket, safe='')}", spec)
        return float(result["seconds"])

    def object_names(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object name in ``bucket`` under ``prefix``, sorted."""
        query = urllib.parse.urlencode({"prefix": prefix})
        result = self._admin("GET", f"objects/{urllib.parse.quote(bucket, safe='')}?{query}")
        return list(result["names"])

    def add_fault(
        self,
        op: str,
        kind: str,
        *,
        nth: int | None = None,
        count: int | None = 1,
        match: str | None = None,
        stall_seconds: float = 30.0,
    ) -> int:
        """Inject a fault.

        Args:
            op: Operation (one of :data:`OPERATIONS`) or ``"*"`` for any.
            kind: One of :data:`FAULT_KINDS`: an HTTP status (``"403"``,
                ``"404"``, ``"405"``, ``"408"``, ``"429"``, ``"500"``, ``"501"``,
                ``"502"``, ``"503"``, ``"504"``: GCS's error answer with that
                status; ``"501"`` on ``mpu_*`` models an endpoint without the XML
                multipart API), ``"reset"`` (connection reset before an answer),
                ``"truncate"`` (the body stops halfway, its full length announced),
                ``"corrupt"`` (one body byte flipped, headers intact),
                ``"corrupt_request"`` (one byte of the request's body flipped
                before the store sees it), ``"stall"`` (no answer for
                ``stall_seconds``, then the connection closes) or
                ``"stall_answer"`` (the same, after the store has applied the
                request) or ``"stall_apply"`` (no answer for
                ``stall_seconds``, then the store applies the request and it is
                answered as usual).
            nth: The first matching request (1-based, counted from now) that
                fails. Default ``None``: the next one.
            count: How many matching requests fail from there, ``None`` for all.
                Default 1.
            match: Only requests whose object name (or list prefix) contains this.
            stall_seconds: How long a ``"stall*"`` fault holds the request.
                Default 30.

        Returns:
            The rule's id.

        Raises:
            ConfigError: Unknown op or kind, or bad counts.
        """
        rule = FaultRule(
            op=op,
            kind=str(kind),
            nth=1 if nth is None else nth,
            count=count,
            match=match,
            stall_seconds=stall_seconds,
        )
        payload = rule.to_dict()
        for key in ("id", "seen", "fired"):
            del payload[key]
        self.faults_active = True
        return int(self._admin("POST", "faults", payload)["id"])

    def faults(self) -> list[dict[str, Any]]:
        """The active fault rules, with how often each matched and fired."""
        return list(self._admin("GET", "faults")["rules"])

    def clear_faults(self) -> None:
        """Remove every fault rule."""
        self._admin("DELETE", "faults")
        self.faults_active = False

    def stats(self) -> dict[str, Any]:
        """Counters since start or the last reset.

        Returns:
            ``requests``; ``by_class`` (``"A"``, ``"B"``, ``"free"``), ``by_op``
            (gRPC calls under the same operations: a read stream one ``get``, a
            write stream one ``put``), ``by_rpc`` (gRPC calls by method, and
            ``BidiReadObject.ranges``) and
            ``by_status`` (status as a string; ``"0"`` for a reset or stall);
            ``faults`` by kind; ``throttled``; ``bytes_in`` / ``bytes_out``;
            ``by_bucket`` (per bucket named in a request: its ``by_op``,
            ``bytes_in`` and ``bytes_out``); ``cpu_seconds`` (the server's CPU
            since the reset) and ``cpu_seconds_total``; for fake-gcs, ``backend_cpu_seconds_total``.
        """
        return dict(self._admin("GET", "stats"))

    def reset_stats(self) -> None:
        """Zero the counters and the CPU clock."""
        self._admin("POST", "stats/reset", {})

    def set_latency(self, latency: str | LatencyModel | None) -> None:
        """Change the latency model (``None``, a preset name or a model)."""
        model = resolve_latency(latency)
        self._admin("POST", "latency", {"latency": model.to_dict() if model else None})
        self._latency = model

    def set_rate_model(self, model: str | RequestRateModel | None) -> None:
        """Install a request-rate model, cold (initial capacity), or remove it (``None``)."""
        resolved = resolve_rate_model(model)
        self._admin("POST", "rate_model", {"model": resolved.to_dict() if resolved else None})

    def rate_model_stats(self) -> dict[str, Any] | None:
        """The request-rate model's state: ``model``, ``elapsed`` and per class
        (``"read"``, ``"write"``) its ``capacity`` now and ``timeline`` (one
        ``[end s, admitted, 429s, 503s, capacity]`` per closed window), or
        ``None`` without a model."""
        result = self._admin("GET", "rate_model")
        return dict(result) if result is not None else None

    def set_rps_cap(self, rps_cap: float | None) -> None:
        """Change the requests-per-second cap (``None``: none)."""
        if rps_cap is not None and rps_cap <= 0:
            raise ConfigError(f"rps_cap must be > 0 or None, got {rps_cap!r}")
        self._admin("POST", "rps_cap", {"rps": rps_cap})
        self.rps_cap = rps_cap
