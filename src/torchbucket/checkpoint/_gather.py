"""The part being filled: copied bytes and views of lent tensors, in order (issue 45).

``torch.save`` writes a checkpoint as many small writes (the pickle, zip
headers, padding: about 4,000 per 512 MiB) and one write per tensor, a view of
its storage. Where that storage is one the save holds (:mod:`._lent`), a
part takes the view itself as one of its pieces, however small the tensor
(down to :data:`LEND_MIN`) and wherever it begins or ends; only the other
writes are copied, into pool buffers of at most :data:`CHUNK` bytes taken as
they fill (a part of a state dict is mostly lent: a whole part's buffer for
it would be faulted in, zeroed, and hardly used). A part is sent as its pieces,
one after another (``ObjectStore.multipart_upload_part`` takes a list of
buffers), so a state dict's tensors are never copied on their way to the
wire: before, a tensor was lent only in whole parts, and the small tensors
and each one's first and last part were copied (a third of a 512 MiB state
dict of the benchmark's, 0.1 CPU s).
"""

from __future__ import annotations

from torchbucket.checkpoint._parts import BufferPool

__all__ = ["CHUNK", "LEND_MIN", "PartBuilder"]

#: The smallest write lent rather than copied: below it, a piece of its own
#: costs the upload more than the copy saves.
LEND_MIN = 64 * 1024
#: The size of the buffers copied bytes go into (smaller where parts are).
CHUNK = 1024 * 1024


class PartBuilder:
    """One part of ``size`` bytes, built from copied bytes and lent views.

    Args:
        pool: Where the buffers for copied bytes come from (taken as needed,
            returned by whoever releases the part: :attr:`buffers`).
        size: The part's size.
    """

    def __init__(self, pool: BufferPool, size: int) -> None:
        self._pool = pool
        self.size = size
        self.filled = 0
        #: The buffers copied bytes went into, to give back once the part is sent.
        self.buffers: list[bytearray] = []
        self._used = 0  # bytes used in the last buffer
        # Pieces in order: a view of a lent storage, or (buffer index, start, end).
        self._pieces: list[memoryview | tuple[int, int, int]] = []

    @property
    def room(self) -> int:
        """Bytes still missing."""
        return self.size - self.filled

    def copy(self, view: memoryview) -> None:
        """Append ``view``'s bytes, copied (at most :attr:`room` of them)."""
        offset = 0
        while offset < len(view):
            if not self.buffers or self._used == len(self.buffers[-1]):
                self.buffers.append(self._pool.take(min(CHUNK, self.size)))
                self._used = 0
            index, buffer = len(self.buffers) - 1, self.buffers[-1]
            count = min(len(buffer) - self._used, len(view) - offset)
            start, end = self._used, self._used + count
            buffer[start:end] = view[offset : offset + count]
            last = self._pieces[-1] if self._pieces else None
            if isinstance(last, tuple) and last[0] == index and last[2] == start:
                self._pieces[-1] = (index, last[1], end)
            else:
                self._pieces.append((index, start, end))
            self._used = end
            offset += count
        self.filled += len(view)

    def lend(self, view: memoryview) -> None:
        """Append ``view`` itself: it must stay valid until the part is released."""
        self._pieces.append(view)
        self.filled += len(view)

    def pieces(self) -> list[memoryview]:
        """The part's bytes, in order, as views."""
        out: list[memoryview] = []
        for piece in self._pieces:
            if isinstance(piece, tuple):
                index, start, end = piece
                out.append(memoryview(self.buffers[index])[start:end])
            else:
                out.append(piece)
        return out
