"""What ``dataloading.py --zonal`` and ``shards.py --zonal`` share (issue 42 point 6).

Both run, on the same emulator (``Emulator(grpc=True)``), torchbucket's
defaults on a zonal (Rapid) bucket over gRPC against gcsfs's best path on the
same gRPC endpoint (``_contenders/_gcsfs_zonal.py``, also used by
``zonal.py``), and torchbucket on a regional bucket over the JSON API for
scale. A zonal copy of a dataset's bucket is ``<bucket>-zonal``. Figures are
per MiB of samples, so that 10 KiB and 100 KiB runs compare:
``client_cpu_ms_per_mib`` (the contender's processes, DataLoader workers
included) and ``server_cpu_ms_per_mib`` (the emulator's own CPU).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import _harness as h

MiB = 1 << 20
#: Contender families: torchbucket on the zonal bucket (gRPC), gcsfs on it
#: (gRPC), torchbucket on the regional bucket (JSON API).
TB, GCSFS, REGIONAL = "tb_zonal", "gcsfs_zonal", "tb_regional"


def zonal_bucket(bucket: str) -> str:
    """The zonal copy of ``bucket``."""
    return f"{bucket}-zonal"


def create_zonal_bucket(emu: Any, bucket: str) -> None:
    """Create the zonal bucket ``bucket`` (nothing when it exists)."""
    from torchbucket.errors import StorageError

    with contextlib.suppress(StorageError):  # exists already (409)
        emu.create_bucket(bucket, zonal=True)


def spec_for(emu: Any, bucket: str, zonal: bool) -> dict[str, Any]:
    """A contender spec's bucket and, on a zonal bucket, the gRPC endpoint."""
    if not zonal:
        return {"bucket": bucket}
    return {"bucket": zonal_bucket(bucket), "grpc_endpoint": emu.grpc_endpoint}


def per_mib(row: Mapping[str, Any], size: int, cpu: str, server: str) -> dict[str, float]:
    """A contender's figures per MiB of samples: client CPU, emulator CPU, MiB/s.

    ``cpu`` and ``server`` name the row's per-sample milliseconds.
    """
    scale = MiB / size
    return {
        "client_cpu_ms_per_mib": row.get(cpu, math.nan) * scale,
        "server_cpu_ms_per_mib": row.get(server, math.nan) * scale,
        "mib_per_s": row.get("samples_per_s", math.nan) / scale,
    }


def _best(summary: Mapping[str, Mapping[str, Any]], keys: Iterable[str]) -> str | None:
    ran = [(summary[k]["samples_per_s"], k) for k in keys if summary.get(k)]
    return max(ran)[1] if ran else None


def figures(
    result: dict[str, Any],
    summary: Mapping[str, Mapping[str, Any]],
    families: Mapping[str, str],
    *,
    name: str,
    size: int,
    cpu: str,
    server: str,
) -> None:
    """Add one dataset's zonal RESULT keys to ``result``.

    ``speedup_vs_gcsfs_zonal_<name>`` (torchbucket's best samples/s on the
    zonal bucket over gcsfs's best), ``speedup_zonal_vs_regional_<name>``
    (over torchbucket's best on the regional bucket), and per family
    (``zonal``: torchbucket's best, ``zonal_gcsfs``, ``regional``)
    ``client_cpu_ms_per_mib_*_<name>`` and ``server_cpu_ms_per_mib_*_<name>``,
    with ``best_*_<name>`` naming the contender each comes from.

    Args:
        families: Contender key -> family (:data:`TB`, :data:`GCSFS`, :data:`REGIONAL`).
    """
    best = {
        fam: _best(summary, [k for k, f in families.items() if f == fam])
        for fam in (TB, GCSFS, REGIONAL)
    }
    rate = {fam: summary[k]["samples_per_s"] if k else math.nan for fam, k in best.items()}
    result[f"speedup_vs_gcsfs_zonal_{name}"] = round(h.ratio(rate[TB], rate[GCSFS]), 2)
    result[f"speedup_zonal_vs_regional_{name}"] = round(h.ratio(rate[TB], rate[REGIONAL]), 2)
    for fam, label in ((TB, "zonal"), (GCSFS, "zonal_gcsfs"), (REGIONAL, "regional")):
        key = best[fam]
        result[f"best_{label}_{name}"] = key
        if key is None:
            continue
        mib = per_mib(summary[key], size, cpu, server)
        result[f"client_cpu_ms_per_mib_{label}_{name}"] = round(mib["client_cpu_ms_per_mib"], 2)
        result[f"server_cpu_ms_per_mib_{label}_{name}"] = round(mib["server_cpu_ms_per_mib"], 2)


def print_table(
    title: str,
    summary: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, str],
    *,
    size: int,
    cpu: str,
    server: str,
) -> None:
    """One dataset's contenders: samples/s, MiB/s, client and emulator CPU per MiB."""
    rows = [
        {"contender": labels[k], **summary[k], **per_mib(summary[k], size, cpu, server)}
        for k in labels
        if summary.get(k)
    ]
    h.print_table(
        title,
        rows,
        [
            ("contender", "contender", "s"),
            ("samples_per_s", "samples/s", ",.0f"),
            ("mib_per_s", "MiB/s", ",.1f"),
            ("client_cpu_ms_per_mib", "client CPU ms/MiB", ".2f"),
            ("server_cpu_ms_per_mib", "emulator CPU ms/MiB", ".2f"),
            ("repeats", "runs", "d"),
        ],
    )
