"""Configuration of the GCS backend."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from torchbucket._checks import check_config, field_check, nested, one_of, seconds, size, text
from torchbucket.config import ConcurrencyConfig, HedgeConfig, RetryConfig
from torchbucket.errors import ConfigError
from torchbucket.runtime.budget import BudgetConfig

__all__ = ["DEFAULT_ENDPOINT", "GCSConfig"]

#: The public GCS endpoint.
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
_CHUNK_ALIGN = 256 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class GCSConfig:
    """How a :class:`GCSStore` reaches GCS.

    Attributes:
        endpoint: Base URL of the service. Default ``None``: the value of
            ``$STORAGE_EMULATOR_HOST`` when set (``http://`` added when it has no
            scheme), else ``https://storage.googleapis.com``.
        project: Project that quota and requester-pays charges go to, sent as
            ``x-goog-user-project`` on every request. Default ``None`` (the
            credentials' own project).
        retry: Backoff, deadline and timeouts. Default ``RetryConfig()``.
        concurrency: Adaptive limit on requests in flight per process and
            endpoint; its ``max_in_flight`` also sizes the connection pool. Default
            ``ConcurrencyConfig()``.
        anonymous: Send no credentials. Default ``None``: the value of
            ``$TORCHBUCKET_GCS_ANONYMOUS`` when set (``1``/``true`` or
            ``0``/``false``), else anonymous for an emulator (an endpoint from
            ``$STORAGE_EMULATOR_HOST``, or one whose host is not under
            ``googleapis.com``) and credentialed otherwise. ``False`` sends
            Google application default credentials to any endpoint, an
            emulator that requires auth included.
        max_simple_upload_size: The largest ``put`` sent as one request; more
            bytes go as a resumable upload. Default 8 MiB.
        upload_chunk_size: Bytes per request of a resumable upload (a gRPC
            appendable upload flushes every four times that), a multiple of
            256 KiB. Default 16 MiB.
        connect_timeout: Seconds to open a connection. Default 10.
        hedge: When a slow read gets a second request (object reads and
            ranges: datasets, checkpoint and DCP loads). Default
            ``HedgeConfig()`` (on; see docs/benchmarks.md for what it buys
            under a latency tail and what it costs).
        budget: The job-wide request budget per bucket, shared by a rank's
            DataLoader workers and across ranks (see
            :mod:`torchbucket.runtime.budget`; ``$TORCHBUCKET_BUDGET`` wins).
            Default ``BudgetConfig()`` (off).
        transport: Which API reads and writes take: ``"auto"`` (gRPC bidi
            streams on a zonal (Rapid) bucket, found out once per process from
            the bucket's metadata; the JSON API elsewhere), ``"grpc"`` (gRPC
            whatever the bucket; a zonal bucket's rules: no compose, copy or
            multipart) or ``"http"`` (the JSON API whatever the bucket).
            gRPC needs ``torchbucket[rapid]``. Default ``"auto"``.
        grpc_endpoint: Where gRPC goes: ``https://host[:port]`` (TLS) or
            ``http://host:port`` (plaintext, an emulator's gRPC port). Default
            ``None``: ``$TORCHBUCKET_GCS_GRPC_ENDPOINT`` where set, else
            Google's (``storage.googleapis.com:443``) for Google's endpoint,
            and none for an emulator (``"auto"`` then takes the JSON API
            without asking the bucket).
    """

    endpoint: str | None = text(None, starts_with=("http://", "https://"), optional=True)
    project: str | None = text(None, optional=True)
    retry: RetryConfig = nested(RetryConfig)
    concurrency: ConcurrencyConfig = nested(ConcurrencyConfig)
    anonymous: bool | None = field_check(
        None,
        kind="switch",
        wanted="True or False",
        optional=True,
        accepts=lambda v: isinstance(v, bool),
    )
    max_simple_upload_size: int = size(8 << 20, minimum=0)
    upload_chunk_size: int = size(16 << 20, minimum=_CHUNK_ALIGN, multiple_of=_CHUNK_ALIGN)
    connect_timeout: float = seconds(10.0, positive=True)
    hedge: HedgeConfig = nested(HedgeConfig)
    budget: BudgetConfig = nested(BudgetConfig)
    transport: str = one_of("auto", ("auto", "grpc", "http"))
    grpc_endpoint: str | None = text(None, starts_with=("http://", "https://"), optional=True)

    def __post_init__(self) -> None:
        check_config(self)

    def resolved_endpoint(self) -> tuple[str, bool]:
        """The endpoint to use and whether it is anonymous (see the attributes)."""
        endpoint = self.endpoint
        emulator = False
        if endpoint is None:
            host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
            if host:
                endpoint = host if "://" in host else f"http://{host}"
                emulator = True
            else:
                endpoint = DEFAULT_ENDPOINT
        endpoint = endpoint.rstrip("/")
        anonymous = self.anonymous
        if anonymous is None:
            anonymous = _env_flag("TORCHBUCKET_GCS_ANONYMOUS")
        if anonymous is None:
            hostname = urlsplit(endpoint).hostname or ""
            anonymous = emulator or not (
                hostname == "googleapis.com" or hostname.endswith(".googleapis.com")
            )
        return endpoint, anonymous


def _env_flag(name: str) -> bool | None:
    """``$name`` as a boolean, ``None`` when unset or empty.

    Raises:
        ConfigError: Set to something else than 1/0, true/false, yes/no.
    """
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ConfigError(f"${name} must be 1/true/yes or 0/false/no, got {value!r}")
