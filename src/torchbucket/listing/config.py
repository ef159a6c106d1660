"""How a prefix is listed: :class:`ListingConfig`."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from torchbucket._checks import (
    check_config,
    count,
    field_check,
    in_flight,
    one_of,
    seconds,
    switch,
)

__all__ = ["ListingConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ListingConfig:
    """How a prefix is listed.

    Attributes:
        pages_in_flight: Most page requests in flight at once. Default 64: at 60 ms
            a page, parsing the pages (about 2 ms of CPU each) rather than the
            round trips sets the pace, so 100k objects list in about 0.45 s
            (0.49 s at 32; emulator, same-region latency); that is about 1,000
            list calls/s while it lasts, a small fraction of what a bucket
            serves. Requests go out only for ranges the names seen so far
            call for, so a small prefix never sees 64.
        objects_per_page: Objects asked for per page. Default 1000, the most GCS
            returns.
        include_hidden: Also list torchbucket's temporary composites
            (``dataflux-composed-objects/``) and the local store's multipart
            staging entries. Default ``False``.
        include_folders: Also list folder placeholders (names ending in ``/``).
            Default ``False``.
        storage_classes: List only objects in these storage classes
            (``{"STANDARD", "NEARLINE"}``...), or ``None`` for all. Objects whose
            store reports no class (memory and local stores) are always listed.
            Default ``None``.
        progress: A progress bar of objects found on stderr: ``"auto"`` shows
            it when stderr is a terminal, ``True`` always, ``False`` never.
            Default ``"auto"``.
        broadcast: Under ``torch.distributed`` with more than one rank, rank 0
            lists and the others receive its listing: ``"auto"`` does so when a
            process group is initialised, ``False`` lists on every rank (and
            lets a single rank list alone). Default ``"auto"``.
        cache: Where to keep a manifest of the listing: a local path,
            ``file:///path`` or an object URI (``gs://bucket/manifests/train.json.gz``).
            When it holds a listing of the same prefix with the same filters,
            it is used instead of listing; otherwise the listing is written
            there. The manifest is not refreshed: objects added or removed
            since it was written are not seen (delete it, or set
            ``cache_max_age``). One that names an object outside the prefix,
            or decompresses past 1 GiB, is not used (a WARNING says why).
            Default ``None`` (no cache).
        cache_max_age: Seconds after which a manifest is ignored and the prefix
            listed again, or ``None`` for no limit. Default ``None``.
    """

    pages_in_flight: int = in_flight(64)
    objects_per_page: int = count(1000, maximum=1000)
    include_hidden: bool = switch(False)
    include_folders: bool = switch(False)
    storage_classes: frozenset[str] | None = field_check(
        None,
        kind="other",
        wanted="a non-empty set of class names",
        optional=True,
        accepts=lambda v: (
            isinstance(v, Collection) and not isinstance(v, str | bytes) and len(v) > 0
        ),
    )
    progress: bool | Literal["auto"] = one_of("auto", (True, False, "auto"))
    broadcast: bool | Literal["auto"] = one_of("auto", (True, False, "auto"))
    cache: str | os.PathLike[str] | None = field_check(
        None,
        kind="other",
        wanted="a path, file:// or object URI",
        optional=True,
        accepts=lambda v: isinstance(v, str | os.PathLike),
    )
    cache_max_age: float | None = seconds(None, optional=True)

    def __post_init__(self) -> None:
        check_config(self)
        if self.storage_classes is not None:
            classes = frozenset(str(c).upper() for c in self.storage_classes)
            object.__setattr__(self, "storage_classes", classes)

    def _filters(self) -> dict[str, Any]:
        classes = self.storage_classes
        return {
            "include_hidden": self.include_hidden,
            "include_folders": self.include_folders,
            "storage_classes": None if classes is None else sorted(classes),
        }
