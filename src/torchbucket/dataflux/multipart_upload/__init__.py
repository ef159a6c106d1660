"""``dataflux_pytorch.multipart_upload``: upload a ``BytesIO`` in parallel parts."""

from __future__ import annotations

from torchbucket.dataflux.multipart_upload import multipart

__all__ = ["multipart"]
