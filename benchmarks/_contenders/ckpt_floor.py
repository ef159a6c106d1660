"""Checkpoint contender: the floor, this client's own byte movers with no torch (issue 45).

A save uploads a preallocated buffer of the checkpoint's size (its pages
already touched) straight through the writer's upload session
(``torchbucket.checkpoint._upload.open_session``): parts of
``CheckpointConfig.part_size`` that are views of the buffer, at most
``parts_in_flight`` of them at once, the running CRC32C of the whole
object computed as each part is handed over, as the writer does; no part
buffer, so no copy. A load is the reader's raw ranged download
(``torchbucket.checkpoint._reader.download``): metadata first, every range
pinned to that generation, into a buffer allocated before the measured phase,
then the CRC32C of every byte against the object's. Its pages are fresh (the
kernel allocates them as the download's waiting thread prefaults them, as for
any load, whose tensors need new memory); with the spec's ``floor_touched``
(``checkpoint.py --floor-touched``) they are touched beforehand, the floor of
a load into memory one already has. Neither builds or reads a tensor.

What a contender adds to these figures is what it does beyond moving the
bytes: serializing (``torch.save``), copying into part buffers, allocating the
pages a load's tensors live in, deserializing. ``fraction_of_floor`` in the
benchmark is this contender's time over another's.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit
from ckpt_common import measured, spec_args

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint._pages import allocate
from torchbucket.checkpoint._reader import download
from torchbucket.checkpoint._upload import open_session
from torchbucket.storage.base import ObjectStore
from torchbucket.storage.crc32c import Crc32c
from torchbucket.storage.gcs import GCSConfig


def touched_buffer(size: int, fill: bool) -> memoryview:
    """``allocate(size)`` with every page touched (random-looking bytes if ``fill``)."""
    buffer = allocate(size)
    array = np.frombuffer(buffer, dtype=np.uint8)
    if fill:
        block = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
        for start in range(0, size, len(block)):
            piece = array[start : start + len(block)]
            piece[:] = block[: len(piece)]
    else:
        array[:] = 0
    return buffer


async def upload(store: ObjectStore, key: str, buffer: memoryview, config: CheckpointConfig) -> Any:
    """The buffer through a multipart session, views of it as parts, CRC32C as handed over."""
    session = open_session(store, key, "multipart")
    slots = asyncio.Semaphore(config.parts_in_flight)
    crc = Crc32c()
    size, part = len(buffer), config.part_size
    for number, start in enumerate(range(0, size, part), 1):
        await slots.acquire()
        view = buffer[start : start + part]
        crc.update(view)
        session.start_part(number, view, slots.release)
    info = await session.finish()
    if info.crc32c is not None and info.crc32c != crc.b64():
        raise SystemExit(f"floor save: crc32c {info.crc32c} != {crc.b64()}")
    return info


def main() -> None:
    args = spec_args()
    config = CheckpointConfig(**getattr(args, "tb_config", None) or {})
    checkpoint = BucketCheckpoint(config=config, gcs=GCSConfig(endpoint=args.endpoint))
    checkpoint.exists(f"gs://{args.bucket}/{args.name}.warm-up")  # opens the store
    store, key = checkpoint.open(f"gs://{args.bucket}/{args.name}")
    result: dict[str, Any] = {"op": args.op, "pid": os.getpid(), "nbytes": args.size}
    if args.op == "save":
        buffer = touched_buffer(args.size, fill=True)
        with measured(result, args.endpoint):
            runtime.run(upload(store, key, buffer, config))
    else:
        info = runtime.run(store.head(key))
        # Fresh pages, as a load's tensors need (their faults are timed), unless
        # the spec asks for pages already touched (a load into memory one has).
        touched = bool(getattr(args, "floor_touched", False))
        buffer = touched_buffer(info.size, fill=False) if touched else allocate(info.size)
        result["touched"] = touched
        with measured(result, args.endpoint):
            info = runtime.run(store.head(key))
            download(store, key, info, buffer, config)  # raises on a CRC32C mismatch
        result["nbytes"] = info.size
        result["verified_crc32c"] = info.crc32c
    emit(result)


if __name__ == "__main__":
    main()
