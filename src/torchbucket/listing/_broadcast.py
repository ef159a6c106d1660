"""Listed once per job: rank 0 lists, the other ranks receive its listing.

Under ``torch.distributed`` with more than one rank, :func:`shared_listing`
runs the listing on rank 0 only and sends it to the others as columns
(:mod:`._columns`: a few lists pickle far smaller and faster than a million
``ObjectInfo``). Rank 0 returns the objects it listed as they are; only the
receivers decode. A failure on rank 0 is sent instead of a listing, so that
every rank raises rather than waits.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

from torchbucket.errors import StorageError
from torchbucket.listing._columns import decode_objects, encode_objects
from torchbucket.storage.base import ObjectInfo

__all__ = ["shared_listing", "world"]


def world() -> tuple[int, int]:
    """(rank, world size) of an initialised default process group, else (0, 1).

    A DataLoader worker inherits its rank's process group through ``fork`` but
    must never join a collective with it: there it is (0, 1).
    """
    dist = sys.modules.get("torch.distributed")
    # Without torch imported there can be no process group: do not import it.
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    data = sys.modules.get("torch.utils.data")
    if data is not None and data.get_worker_info() is not None:
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def _broadcast(payload: object) -> object:
    """Rank 0's ``payload`` on every rank (run in a worker thread)."""
    import torch
    import torch.distributed as dist

    device = None
    if dist.get_backend() == "nccl":
        # NCCL moves the pickled listing through a GPU, and this thread has
        # no current device of its own: use the rank's, as torchrun numbers it.
        local = os.environ.get("LOCAL_RANK")
        device = torch.device("cuda", int(local) if local else torch.cuda.current_device())
    box = [payload]
    dist.broadcast_object_list(box, src=0, device=device)
    return box[0]


async def shared_listing(
    rank: int, uri: str, list_here: Callable[[], Awaitable[list[ObjectInfo]]]
) -> list[ObjectInfo]:
    """Rank 0's listing on every rank: rank 0 runs ``list_here``, the others wait.

    Every rank must call it (it is a collective).

    Raises:
        StorageError: Rank 0's listing failed (on rank 0 the original error; on
            the others a :class:`StorageError` of the same type when it was
            one), or what arrived is not a listing.
    """
    if rank == 0:
        try:
            objects = await list_here()
        except Exception as exc:
            # The other ranks are waiting for a listing: fail them too.
            failure = (
                exc
                if isinstance(exc, StorageError)
                else StorageError(f"rank 0 failed to list: {exc!r}", operation="list", uri=uri)
            )
            await asyncio.to_thread(_broadcast, failure)
            raise
        await asyncio.to_thread(_broadcast, encode_objects(objects))
        return objects
    received = await asyncio.to_thread(_broadcast, None)
    if isinstance(received, StorageError):
        raise received
    if not isinstance(received, dict):
        raise StorageError(
            f"rank 0 broadcast {type(received).__name__}, not a listing",
            operation="list",
            uri=uri,
        )
    return decode_objects(received)
