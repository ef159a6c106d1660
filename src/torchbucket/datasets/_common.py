"""What both datasets share: applying ``data_format_fn``, the compose hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import get_worker_info

from torchbucket import runtime
from torchbucket._checks import check_instance
from torchbucket.compose import ComposeConfig, soft_delete_allows
from torchbucket.compose.registry import install_sigterm_handler
from torchbucket.datasets._handover import hand_over
from torchbucket.datasets._receive import Sample
from torchbucket.datasets.catalog import Catalog
from torchbucket.datasets.checks import check_configs
from torchbucket.datasets.format_fn import call_format_fn

__all__ = [
    "DataFormatFn",
    "apply_format",
    "check_dataset_arguments",
    "prepare_compose",
    "raise_item",
    "read_compose_policies",
]

#: Receives the object's ``bytes``, or with ``FetchConfig(output="tensor")`` the
#: 1-D ``torch.uint8`` tensor it was received into.
DataFormatFn = Callable[[Any], Any]


def apply_format(
    fn: DataFormatFn | None, data: Sample, catalog: Catalog, index: int, *, handing: bool = False
) -> Any:
    """``fn(data)``; an error it raises keeps its type and gains a note naming the URI.

    The note shows in the traceback, and so in the message a DataLoader worker's
    error is re-raised with in the main process. With no ``fn``, the raw sample,
    as a ``_handover.HandedBytes`` when ``handing``.
    """
    if fn is None:
        return hand_over(data) if handing else data
    return call_format_fn(fn, data, catalog.uri(index))


def raise_item(item: Sample | BaseException) -> Sample:
    """The sample, or raise the error fetching it raised."""
    if isinstance(item, BaseException):
        raise item
    return item


def prepare_compose(compose: ComposeConfig) -> None:
    """Before fetching in a process: SIGTERM deletes its composites (main thread)."""
    if compose.enabled:
        install_sigterm_handler(dataloader_worker=get_worker_info() is not None)


def read_compose_policies(catalog: Catalog, *configs: ComposeConfig) -> None:
    """Read each bucket's soft-delete policy now, in the process that builds the dataset.

    Compose asks for it once per process (``compose/_softdelete.py``), and
    DataLoader workers that are not persistent are new processes every epoch:
    each one's first composed group waited for a ``buckets.get`` of its own
    (a round trip, and under the emulator's ``same-region-tail`` now and then a
    2 s stall), and where soft delete turns compose off each worker logged the
    same INFO line, epoch after epoch. Forked workers inherit what is read here;
    spawned ones read it themselves. A policy that cannot be read is unknown
    and compose goes ahead, as in a worker.
    """
    config = next((c for c in configs if c.enabled and not c.allow_with_soft_delete), None)
    if config is None:
        return
    stores = [s for s in catalog.stores if s.bucket != "/"]

    async def read() -> None:
        for store in stores:
            await soft_delete_allows(store, config)

    if stores:
        runtime.run(read())


def check_dataset_arguments(
    owner: object, catalog: Any, data_format_fn: Any, compose: Any, **configs: Any
) -> None:
    """Check a dataset constructor's arguments; ``configs`` maps a name to ``(value, type)``.

    Raises:
        ConfigError: An argument is not of its type, naming it.
    """
    name = type(owner).__name__
    hint = "build the dataset with from_prefix or from_objects"
    check_instance(catalog, Catalog, owner=name, parameter="catalog", optional=False, hint=hint)
    check_configs(name, data_format_fn, compose=(compose, ComposeConfig), **configs)
