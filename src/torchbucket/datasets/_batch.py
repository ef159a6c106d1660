"""Fetching objects of a catalog: one unit (an object, or a group to compose), and a batch.

Each object comes back as its bytes, or the tensor it was received into
(``FetchConfig.output``; see ``_receive``), or the error reading it raised.
The ordered prefetch window (``_fetch``) fetches the same units.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from torchbucket.compose import Anchor, ComposeConfig, fetch_group
from torchbucket.datasets._receive import (
    Sample,
    SharedComposite,
    SharedSlab,
    read_object,
    to_output,
)
from torchbucket.datasets._units import plan_units
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.config import FetchConfig
from torchbucket.storage.batch import read_batch

__all__ = ["Item", "fetch_batch", "fetch_unit"]

Item = Sample | BaseException


async def fetch_unit(
    catalog: Catalog,
    indices: Sequence[int],
    compose: ComposeConfig,
    fetch: FetchConfig,
    slab: SharedSlab | None = None,
    needed: asyncio.Event | None = None,
    anchors: dict[str, Anchor] | None = None,
) -> list[Item]:
    store = catalog.store(indices[0])
    if len(indices) == 1:
        try:
            return [await read_object(store, catalog.info(indices[0]), fetch, slab)]
        except Exception as exc:  # handed to the consumer, raised there in order
            return [exc]
    anchor = None
    if anchors is not None:
        anchor = anchors.get(store.uri())
        if anchor is None:
            anchor = anchors[store.uri()] = Anchor(store, compose)
    try:
        items = await fetch_group(
            store,
            [catalog.info(i) for i in indices],
            compose,
            receive_into=SharedComposite if fetch.output == "tensor" else None,
            needed=needed,
            anchor=anchor,
        )
    except Exception as exc:  # the same: a prefetch window would otherwise wait forever
        return [exc] * len(indices)
    # Objects of a group read directly (its compose path failed or was read
    # around) come as bytes: as tensors, they share one segment.
    slab = None
    if fetch.output == "tensor":
        slab = SharedSlab.fitting([len(i) for i in items if isinstance(i, bytes)])
    return [i if isinstance(i, BaseException) else to_output(i, fetch, slab) for i in items]


async def fetch_batch(
    catalog: Catalog, indices: Sequence[int], compose: ComposeConfig, fetch: FetchConfig
) -> list[Item]:
    """Fetch the objects at ``indices`` concurrently, composing small ones.

    Returns:
        Per index, its bytes or the error reading it raised.
    """
    units = plan_units(catalog, indices, compose)
    slab = None
    if fetch.output == "tensor":
        # The batch's objects read one by one share one segment (gzip objects,
        # whose decoded size is not their listed one, get their own tensors).
        singles = [indices[u.start] for u in units if len(u) == 1]
        singles = [i for i in singles if i not in catalog.transcoded]
        slab = SharedSlab.fitting(catalog.sizes[singles].tolist())
    # The caller waits for all of them: its last stragglers are hedged early.
    with read_batch():
        results = await asyncio.gather(
            *(
                fetch_unit(catalog, [indices[p] for p in unit], compose, fetch, slab)
                for unit in units
            )
        )
    if len(units) == len(indices):
        return [r[0] for r in results]
    return [item for unit_items in results for item in unit_items]
