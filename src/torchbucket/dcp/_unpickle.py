"""Reading a DCP ``.metadata`` without running code from it.

``.metadata`` is a pickle, and a pickle can name any callable to rebuild an
object: ``os.system`` with a command, say. Whoever can write an object in a
bucket must not be able to run code in every job that loads a checkpoint from
it, so the metadata is read by an unpickler that admits only what DCP's
metadata is made of (as torch's planners and writers produce it, torch
2.0-2.13): the classes of ``torch.distributed.checkpoint.metadata``, the
storage descriptors torch's writers put in ``storage_data``, ``torch.Size``,
dtypes and layouts, paths and basic containers. Anything else is refused
before it is called, with a :class:`~torchbucket.errors.CheckpointError`
naming the metadata object and the refused global.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from torchbucket.errors import CheckpointError

__all__ = ["load_metadata"]

#: Globals a DCP ``.metadata`` may name, by module.
_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "StorageMeta",
            "MetadataIndex",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    # Where TensorProperties lived before torch 2.2 (still importable there).
    "torch.distributed._shard.sharded_tensor.metadata": frozenset(
        {"TensorProperties", "MEM_FORMAT_ENCODING"}
    ),
    # What torch's writers (FileSystemWriter, the fsspec writer, this
    # package's writer) record per item in ``storage_data``.
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    # ``torch.layout`` pickles as ``_get_layout("torch.strided")``, which looks
    # the name up among torch's layouts.
    "torch.serialization": frozenset({"_get_layout"}),
    # FileSystemWriter records its folder as the checkpoint id.
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict", "defaultdict"}),
    "builtins": frozenset({"dict", "list", "tuple", "set", "frozenset", "complex", "slice"}),
}

#: The kinds of ``torch.<name>`` global admitted (``torch.float32``, ...).
_TORCH_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of DCP metadata."""

    def __init__(self, file: io.BufferedIOBase | io.BytesIO, uri: str) -> None:
        super().__init__(file)
        self._uri = uri

    def find_class(self, module: str, name: str) -> Any:
        # ``vars``, not ``getattr``: torch imports some submodules on attribute access.
        if module == "torch" and (
            name in ("Size", "device") or isinstance(vars(torch).get(name), _TORCH_TYPES)
        ):
            return getattr(torch, name)
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise CheckpointError(
            f"refused to load {module}.{name}: DCP metadata is made of torch's metadata "
            "classes and plain containers only, and loading this would run code from the "
            "checkpoint (was the object written by someone else?)",
            operation="dcp load",
            uri=self._uri,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(
            "refused a persistent id: DCP metadata has none",
            operation="dcp load",
            uri=self._uri,
        )


def load_metadata(data: bytes, uri: str) -> Metadata:
    """The :class:`Metadata` pickled in ``data``, read by the restricted unpickler.

    Args:
        data: The bytes of the ``.metadata`` object.
        uri: Its URI, named in errors.

    Returns:
        The metadata.

    Raises:
        CheckpointError: The pickle names a global that DCP metadata is not made
            of (nothing it names was called), or the bytes are not a whole pickle
            of DCP metadata (random, truncated or another kind of file).
    """
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), uri).load()
    except CheckpointError:
        raise
    except Exception as exc:  # any failure to parse is a corrupt file
        raise CheckpointError(
            f"not DCP metadata, or corrupt ({len(data)} bytes that do not unpickle: "
            f"{type(exc).__name__}: {exc})",
            operation="dcp load",
            uri=uri,
        ) from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"not DCP metadata: the file holds a {type(metadata).__name__}, not a Metadata",
            operation="dcp load",
            uri=uri,
        )
    return metadata
