"""Checkpoint contender: gcsfs (fsspec), ``torch.save`` / ``torch.load`` through ``fs.open``.

What a user of fsspec writes: ``with fs.open("bkt/x.pt", "wb") as f:
torch.save(sd, f)`` and ``with fs.open("bkt/x.pt", "rb") as f: torch.load(f)``,
with gcsfs's defaults (5 MiB blocks: a resumable upload of one chunk at a time
on save; on load, one ranged GET per block read, through its read-ahead
cache). Runs in ``.venv-gcsfs`` (gcsfs 2026.x needs google-cloud-storage>=3,
dataflux's ``.venv-bench`` <3).

``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` is set: gcsfs 2026.x otherwise
first asks a gRPC API what kind of bucket it is (zonal, hierarchical), which an
HTTP-only endpoint never answers. The emulator is reached through
``endpoint_url`` with ``token="anon"``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import main_single


def filesystem(endpoint: str) -> Any:
    """A gcsfs filesystem on the emulator, anonymous, not shared with other instances."""
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon", skip_instance_cache=True)


def prepare(args: SimpleNamespace) -> Any:
    fs = filesystem(args.endpoint)
    fs.exists(f"{args.bucket}/{args.name}.warm-up")  # opens a connection
    return fs


def save(fs: Any, args: SimpleNamespace, state_dict: dict[str, Any]) -> None:
    with fs.open(f"{args.bucket}/{args.name}", "wb") as f:
        torch.save(state_dict, f)


def load(fs: Any, args: SimpleNamespace) -> dict[str, Any]:
    with fs.open(f"{args.bucket}/{args.name}", "rb") as f:
        return torch.load(f, weights_only=True)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main_single(prepare, save, load)
