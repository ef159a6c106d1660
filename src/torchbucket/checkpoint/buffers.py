"""The load buffers of :mod:`torchbucket.checkpoint`, for the other checkpoint loaders.

``torchbucket.dcp`` reads DCP data files into the same kind of buffer a
checkpoint load uses (:func:`allocate`: pages untouched until written, from a
private mapping for large sizes) and serves them to ``torch`` as a file without
a copy (:class:`MemoryFile`). They are defined with the checkpoint reader,
which owns how a load uses memory; this module is the name other packages
import them by (a package's ``_`` modules are its own).
"""

from __future__ import annotations

from torchbucket.checkpoint._pages import allocate
from torchbucket.checkpoint._reader import MemoryFile

__all__ = ["MemoryFile", "allocate"]
