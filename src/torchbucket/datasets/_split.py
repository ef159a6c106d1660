"""Parts of a dataset's listing: ``split`` (as ``random_split`` cuts) and ``subset``.

``torch.utils.data.random_split`` and ``Subset`` wrap a dataset in a
``Subset``: torch's sampler then sizes and indexes the wrapper, so the dataset
never sees the order it is about to be asked for (``_observed``), and a plain
DataLoader over the wrapper reads one batch at a time. A part made here is a
dataset of its own over part of the same listing, and reads ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, random_split

from torchbucket.datasets.catalog import Catalog
from torchbucket.errors import ConfigError

__all__ = ["split_catalog", "subset_catalog"]


def split_catalog(
    catalog: Catalog,
    lengths: Sequence[int | float],
    generator: torch.Generator | None,
    owner: str,
) -> list[Catalog]:
    """``catalog`` cut as ``random_split(dataset, lengths, generator)`` cuts a dataset of its length.

    torch's own function draws the parts (of a ``range``): its rules for
    fractions and their remainders, and its random stream, so the same
    generator state gives the same parts as ``random_split`` would.

    Raises:
        ConfigError: ``lengths`` do not add up (counts to the length,
            fractions to 1), or a part would be empty.
    """
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise ConfigError(
            f"{owner}: lengths must be a sequence of counts or fractions, got {lengths!r}"
        )
    try:
        # A range stands in for the dataset: random_split only sizes and wraps it.
        parts: list[Subset[int]] = random_split(
            cast("Dataset[int]", range(len(catalog))),
            lengths,
            generator=generator if generator is not None else torch.default_generator,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{owner}: lengths {list(lengths)!r} do not cut a dataset of {len(catalog)} objects: {exc}"
        ) from None
    empty = [k for k, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ConfigError(
            f"{owner}: lengths {list(lengths)!r} leave part {empty[0]} of a dataset of "
            f"{len(catalog)} objects empty"
        )
    return [catalog.select(np.asarray(part.indices, dtype=np.int64)) for part in parts]


def subset_catalog(catalog: Catalog, indices: Sequence[int], owner: str) -> Catalog:
    """The objects of ``catalog`` at ``indices``, in that order (repeats allowed, as in ``Subset``).

    Raises:
        ConfigError: ``indices`` is empty or not integers.
        IndexError: An index is out of range.
    """
    try:
        picked = np.asarray(indices, dtype=np.int64).reshape(-1)
        whole = np.array_equal(picked, np.asarray(indices).reshape(-1))
    except (TypeError, ValueError):
        whole = False
    if not whole:
        raise ConfigError(f"{owner}: indices must be integers, got {indices!r}")
    if not len(picked):
        raise ConfigError(f"{owner}: indices is empty; a dataset needs at least one object")
    n = len(catalog)
    outside = picked[(picked < 0) | (picked >= n)]
    if len(outside):
        raise IndexError(
            f"{owner}: index {int(outside[0])} out of range for a dataset of {n} objects"
        )
    return catalog.select(picked)
