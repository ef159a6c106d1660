"""Pins: what each data file of a DCP checkpoint held when it was saved.

:class:`BucketStorageWriter` records, in ``.metadata``, the generation, size
and CRC32C of every data file it wrote (as a plain ``dict`` in an extra
attribute of the :class:`Metadata`, which torch's own readers ignore, so the
checkpoint still loads with ``FileSystemReader``). :class:`BucketStorageReader`
reads each file at its pinned generation and checks what it reads against the
CRC32C, so a data file overwritten by another save, replaced or deleted after
the save is a :class:`~torchbucket.errors.CheckpointError`, never tensors from
two saves loaded together. A checkpoint written by torch's own writers has no
pins: its files are pinned to the generations they have when the load starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

from torch.distributed.checkpoint.metadata import Metadata

from torchbucket.errors import CheckpointError, NotFoundError
from torchbucket.runtime.tasks import gather_or_cancel

if TYPE_CHECKING:
    from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["PINS_ATTR", "Pin", "PinnedStore", "pins_of", "record_pins", "replaced_error"]

#: The attribute of the pickled :class:`Metadata` that holds the pins.
PINS_ATTR = "torchbucket_files"


class Pin(NamedTuple):
    """One data file as it was saved."""

    generation: int | None
    crc32c: str | None
    size: int


def record_pins(metadata: Metadata, pins: dict[str, Pin]) -> None:
    """Record ``pins`` (by file name) in ``metadata``, as builtins only."""
    setattr(metadata, PINS_ATTR, {name: dict(pin._asdict()) for name, pin in pins.items()})


def _pin(value: Any) -> Pin | None:
    if not isinstance(value, dict):
        return None
    generation, crc, size = value.get("generation"), value.get("crc32c"), value.get("size")
    if generation is not None and (type(generation) is not int or generation < 0):
        return None
    if crc is not None and not isinstance(crc, str):
        return None
    if type(size) is not int or size < 0:
        return None
    return Pin(generation, crc, size)


def pins_of(metadata: Metadata, uri: str) -> dict[str, Pin] | None:
    """The pins ``metadata`` records, by file name; ``None`` if it records none.

    Args:
        metadata: The checkpoint's metadata.
        uri: The metadata's URI, named in errors.

    Raises:
        CheckpointError: The pins are malformed, or a file the metadata points
            into has none.
    """
    raw = vars(metadata).get(PINS_ATTR)
    if raw is None:
        return None
    pins = {name: _pin(value) for name, value in raw.items()} if isinstance(raw, dict) else {}
    bad = [name for name, pin in pins.items() if pin is None or not isinstance(name, str)]
    if not isinstance(raw, dict) or bad:
        raise CheckpointError(
            f"corrupt DCP metadata: malformed record of the data files ({bad[:3] or raw!r:.80})",
            operation="dcp load",
            uri=uri,
        )
    names = {
        getattr(info, "relative_path", None) for info in (metadata.storage_data or {}).values()
    }
    missing = sorted(str(name) for name in names - pins.keys())
    if missing:
        raise CheckpointError(
            f"corrupt DCP metadata: no record of data file(s) {', '.join(missing[:3])}",
            operation="dcp load",
            uri=uri,
        )
    return cast("dict[str, Pin]", pins)


class PinnedStore:
    """A store whose ranged reads (``get_into``) read each key's pinned generation.

    Only what :func:`~torchbucket.storage.ranges.fetch_ranges` uses is here:
    ``get_into`` and ``uri``.
    """

    def __init__(self, store: ObjectStore, generations: dict[str, int | None]) -> None:
        self._store = store
        self._generations = generations

    def uri(self, key: str = "") -> str:
        """The object's URI."""
        return self._store.uri(key)

    async def get_into(
        self, key: str, buffer: memoryview, *, start: int = 0, generation: int | None = None
    ) -> int:
        """Fill ``buffer`` from ``key``'s pinned generation (``NotFoundError`` if gone)."""
        pinned = self._generations.get(key, generation)
        return await self._store.get_into(key, buffer, start=start, generation=pinned)


async def file_infos(
    store: ObjectStore, files: dict[str, str], pins: dict[str, Pin] | None
) -> dict[str, ObjectInfo]:
    """Each file's saved size, CRC32C and generation, by key: from its pin, or asked now.

    Args:
        store: The checkpoint's store.
        files: The files to read: their names in the checkpoint, by key.
        pins: The checkpoint's pins, or ``None`` (read each file as it is now).

    Raises:
        NotFoundError: A file without a pin does not exist.
    """
    from torchbucket.storage.base import ObjectInfo

    if pins is not None:
        return {
            key: ObjectInfo(key, pins[name].size, pins[name].generation, pins[name].crc32c)
            for key, name in files.items()
        }
    keys = list(files)
    heads = await gather_or_cancel(store.head(key) for key in keys)
    return dict(zip(keys, heads, strict=True))


def replaced_error(
    exc: NotFoundError, uri: str, store: ObjectStore, infos: dict[str, ObjectInfo]
) -> CheckpointError:
    """The error for a data file gone from the generation that was to be read."""
    gone = [(key, info) for key, info in infos.items() if store.uri(key) == exc.uri]
    what = f"{exc.uri} (generation {gone[0][1].generation})" if gone else exc.uri
    return CheckpointError(
        f"data file {what} was replaced or deleted after the checkpoint was saved or "
        "while it loaded (by another save to the same place?): it cannot be loaded whole",
        operation="dcp load",
        uri=uri,
    )
