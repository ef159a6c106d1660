"""DCP contender: torch's own ``FsspecWriter`` / ``FsspecReader`` on gcsfs, 2 ranks.

``torch.distributed.checkpoint``'s fsspec storage on a ``gs://`` path, the
route torch documents for object stores: one file per rank written through
``fs.open(..., "wb")`` (gcsfs: a resumable upload, 5 MiB chunks), read back
through ``fs.open(..., "rb")``, with torch's defaults (one I/O thread per
rank). Runs in ``.venv-gcsfs``; ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``
(see ``ckpt_gcsfs.py``); the emulator through ``endpoint_url``, ``token="anon"``.
gcsfs runs unchanged: the rename at the end of a save (``.metadata.tmp`` to
``.metadata``) is its ``objects.move``, which the emulator serves.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import main_dcp


class Storage:
    """torch's fsspec DCP storage with its defaults, gcsfs underneath."""

    @staticmethod
    def location(args: SimpleNamespace) -> str:
        return f"gs://{args.bucket}/{args.name}"

    @staticmethod
    def prepare(args: SimpleNamespace) -> Any:
        import gcsfs

        # Not timed: the first request (gcsfs caches the instance these
        # options make, so the writer and reader below reuse its session).
        fs = gcsfs.GCSFileSystem(endpoint_url=args.endpoint, token="anon")
        fs.exists(f"{args.bucket}/{args.name}/warm-up")
        return {"endpoint_url": args.endpoint, "token": "anon"}

    @staticmethod
    def writer(options: dict[str, Any], uri: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(uri, **options)

    @staticmethod
    def reader(options: dict[str, Any], uri: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(uri, **options)


if __name__ == "__main__":
    main_dcp(Storage())
