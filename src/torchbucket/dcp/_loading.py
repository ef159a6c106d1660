"""The pieces of a DCP load: ranges grouped into reads, checked and viewed in place."""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
from typing import Any

import torch
from torch.distributed.checkpoint.planner import ReadItem

from torchbucket.checkpoint.buffers import MemoryFile
from torchbucket.errors import CheckpointError
from torchbucket.storage import crc32c as _crc32c

__all__ = ["Window", "covers", "file_crc", "pieces", "view_saved_tensor", "weights_only_bytes"]


def covers(spans: list[tuple[str, int, int]], key: str, size: int) -> bool:
    """Whether the ``(key, start, length)`` spans of ``key`` read it whole, once."""
    pos = 0
    for start, length in sorted((st, n) for k, st, n in spans if k == key):
        if start != pos:
            return False
        pos += length
    return pos == size


def file_crc(spans: list[tuple[str, int, int]], crcs: dict[int, int], key: str) -> str:
    """The CRC32C of ``key``'s spans, in file order, combined (``""`` if one is missing)."""
    crc = 0
    for _, index in sorted((st, i) for i, (k, st, _) in enumerate(spans) if k == key):
        if index not in crcs:
            return ""
        crc = _crc32c.combine(crc, crcs[index], spans[index][2])
    return _crc32c.b64(crc)


def view_saved_tensor(name: str, data: memoryview) -> torch.Tensor | None:
    """The tensor ``torch.save`` wrote into ``data``, as a view of ``data`` (no copy).

    ``torch.load`` with ``map_location="meta"`` reads only the zip's directory
    and pickle: it gives the tensor's dtype, shape and strides, and the offset
    of its bytes inside ``data``, which are then viewed in place. That skips
    ``torch.load``'s copy of every byte into a new storage (the item is copied
    once, into the state dict). ``None`` where that does not apply (not a
    plain tensor, an older torch without the offset, unaligned bytes): the
    caller then loads a copy.
    """
    if sys.byteorder != "little":
        return None
    meta = torch.load(MemoryFile(name, data), map_location="meta", weights_only=True)  # type: ignore[arg-type]
    if not isinstance(meta, torch.Tensor) or meta.is_quantized or meta.layout != torch.strided:
        return None
    storage = meta.untyped_storage()
    offset = getattr(storage, "_checkpoint_offset", None)
    nbytes = storage.nbytes()
    if not isinstance(offset, int) or nbytes == 0 or offset < 0 or offset + nbytes > len(data):
        return None
    raw = torch.frombuffer(data, dtype=torch.uint8, offset=offset, count=nbytes)
    if raw.data_ptr() % meta.element_size():
        return None
    return raw.view(meta.dtype).as_strided(meta.size(), meta.stride(), meta.storage_offset())


def _bytes_io_allowed() -> contextlib.AbstractContextManager[Any]:
    """``io.BytesIO`` admitted by ``weights_only`` for one load (DCP saves such values).

    A ``BytesIO`` rebuilds from its bytes and position only. On a torch without
    ``safe_globals`` (before 2.5) it is refused unless the caller allowed it.
    """
    serialization: Any = torch.serialization
    allow = getattr(serialization, "safe_globals", None)
    if allow is None or io.BytesIO in serialization.get_safe_globals():
        return contextlib.nullcontext()
    return allow([io.BytesIO])  # type: ignore[no-any-return]


def weights_only_bytes(name: str, fqn: str, data: memoryview, uri: str) -> io.BytesIO:
    """A non-tensor item's bytes, as a stream torch's planner may unpickle: no code runs.

    torch's ``DefaultLoadPlanner.load_bytes`` unpickles a ``BYTE_IO`` item with
    ``torch.load(weights_only=False)``, and ``.metadata`` (someone else's, in a
    shared bucket) decides which items are ``BYTE_IO``, even for a name the
    caller's state dict holds a tensor under. So the item is loaded here with
    ``weights_only=True`` (globals allowed by ``torch.serialization.add_safe_globals``
    included), and the planner is given that value saved again by this
    process, never the stored bytes.

    Raises:
        CheckpointError: The item names a global ``weights_only`` refuses, or is
            not a torch pickle; nothing it names was called.
    """
    try:
        with _bytes_io_allowed():
            value = torch.load(MemoryFile(name, data), weights_only=True)  # type: ignore[arg-type]
    except Exception as exc:
        raise CheckpointError(
            f"refused to load {fqn!r} from {name}: a non-tensor value is loaded with "
            f"weights_only=True, which refused it ({type(exc).__name__}: {str(exc)[:300]}); "
            "allow its classes with torch.serialization.add_safe_globals if this "
            "checkpoint is yours",
            operation="dcp load",
            uri=uri,
        ) from exc
    out = io.BytesIO()
    torch.save(value, out)
    out.seek(0)
    return out


def pieces(
    spans: list[tuple[tuple[int, int], ReadItem]], size: int
) -> list[list[tuple[tuple[int, int], ReadItem]]]:
    """Group sorted, overlapping-or-close item spans into runs of about ``size`` bytes."""
    pieces: list[list[tuple[tuple[int, int], ReadItem]]] = []
    for span, item in spans:
        if pieces and span[1] - pieces[-1][0][0][0] <= size:
            pieces[-1].append((span, item))
        else:
            pieces.append([(span, item)])
    return pieces


class Window:
    """Admits jobs (in order) while the bytes admitted and not yet used stay under a bound.

    ``admit`` runs on the loop; ``done`` is called from the thread that uses
    the jobs' bytes. A job larger than the bound is admitted alone.
    """

    def __init__(self, sizes: list[int], limit: int) -> None:
        self._sizes = sizes
        self._limit = limit
        self._held = 0
        self._admitted: list[asyncio.Event] = []
        self._freed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._admitted = [asyncio.Event() for _ in self._sizes]
        self._freed = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        assert self._freed is not None
        for index, size in enumerate(self._sizes):
            while self._held and self._held + size > self._limit:
                self._freed.clear()
                await self._freed.wait()
            self._held += size
            self._admitted[index].set()

    async def admit(self, index: int) -> None:
        await self._admitted[index].wait()

    def _release(self, size: int) -> None:
        assert self._freed is not None
        self._held -= size
        self._freed.set()

    def done(self, index: int) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release, self._sizes[index])
