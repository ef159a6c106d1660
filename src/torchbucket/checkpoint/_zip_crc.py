"""``torch.save`` without its zip CRC32, for :meth:`BucketCheckpoint.save`.

``torch.save`` computes the CRC32 of every record it writes into its zip
archive (miniz's table-driven CRC: 0.34 CPU seconds per 512 MiB on the 2-core
benchmark VM, more than this client's whole upload of those bytes), and
``torch.load`` never checks it: a record with a flipped bit loads as it is.
What guards a checkpoint in a bucket is the CRC32C of every byte, declared
with every part uploaded and compared with the finished object (and with
every byte read on load). So :meth:`BucketCheckpoint.save` turns torch's CRC32
off while it saves (``CheckpointConfig.torch_zip_crc32=True`` keeps it): the
records' CRC fields are then 0, which torch reads as ever and zip tools
(``unzip -t``) report as errors.

torch's switch (``torch.serialization.set_crc32_options``) is process-wide:
while any such save runs, another thread's ``torch.save`` writes CRC fields of
0 too; the setting found before the first of them is put back after the last.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["without_zip_crc"]

_lock = threading.Lock()
_users = 0
_before = True


@contextlib.contextmanager
def without_zip_crc() -> Iterator[None]:
    """Turn ``torch.save``'s record CRC32 off inside the block (where torch has the switch)."""
    import torch.serialization as serialization

    get = getattr(serialization, "get_crc32_options", None)
    set_ = getattr(serialization, "set_crc32_options", None)
    if get is None or set_ is None:  # torch < 2.6: no switch
        yield
        return
    global _users, _before
    with _lock:
        if _users == 0:
            _before = bool(get())
            set_(False)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                set_(_before)
