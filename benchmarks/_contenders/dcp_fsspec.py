"""DCP contender: torch's own ``FsspecWriter`` / ``FsspecReader`` on gcsfs, 2 ranks.

``torch.distributed.checkpoint``'s fsspec storage on a ``gs://`` path, the
route torch documents for object stores: one file per rank written through
``fs.open(..., "wb")`` (gcsfs: a resumable upload, 5 MiB chunks), read back
through ``fs.open(..., "rb")``, with torch's defaults (one I/O thread per
rank). Runs in ``.venv-gcsfs``; ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``
(see ``ckpt_gcsfs.py``); the emulator through ``endpoint_url``, ``token="anon"``;
the rename at the end of a save by copy and delete (see ``_rename_by_copy``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import main_dcp


def _rename_by_copy() -> None:
    """Rename by copy and delete: the emulator has no ``objects.move`` (``moveTo``).

    gcsfs 2026.x renames (torch's writer renames ``.metadata.tmp`` to
    ``.metadata`` once every rank is done) with the JSON API's ``moveTo``, and
    falls back to a copy and a delete when that fails, except on a 404, which
    it raises: the emulator answers an unknown route with 404. This makes the
    fallback the path: one more request (about 40 ms in the latency model) on
    the one small metadata file of a save.
    """
    import gcsfs
    from fsspec import asyn

    async def _mv_file(self: Any, path1: str, path2: str, **kwargs: Any) -> None:
        await self._cp_file(path1, path2)
        await self._rm_file(path1)

    gcsfs.GCSFileSystem._mv_file = _mv_file  # type: ignore[method-assign]
    gcsfs.GCSFileSystem.mv_file = asyn.sync_wrapper(_mv_file)  # type: ignore[method-assign]


class Storage:
    """torch's fsspec DCP storage with its defaults, gcsfs underneath."""

    @staticmethod
    def location(args: SimpleNamespace) -> str:
        return f"gs://{args.bucket}/{args.name}"

    @staticmethod
    def prepare(args: SimpleNamespace) -> Any:
        import gcsfs

        _rename_by_copy()
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
