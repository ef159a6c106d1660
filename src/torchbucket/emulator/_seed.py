"""Bulk seeding: the binary framing of many objects, and generated objects.

The framing is a sequence of records, each ``>IQ`` (name length, data length)
followed by the UTF-8 name and the data. A generator spec describes objects
without sending them: ``{"prefix", "count", "size", "names", "seed"}``, whose
contents :func:`generated_bytes` reproduces anywhere, so a test can check
every byte it reads back.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torchbucket.errors import ConfigError

__all__ = ["decode_frames", "encode_frames", "generated_bytes", "generated_objects"]

_HEADER = struct.Struct(">IQ")


def encode_frames(objects: Iterable[tuple[str, bytes]]) -> bytes:
    """Encode ``(name, data)`` pairs in the seeding framing."""
    out = bytearray()
    pack = _HEADER.pack
    for name, data in objects:
        raw = name.encode()
        out += pack(len(raw), len(data))
        out += raw
        out += data
    return bytes(out)


def decode_frames(body: bytes) -> Iterator[tuple[str, bytes]]:
    """Decode the seeding framing back into ``(name, data)`` pairs.

    Raises:
        ConfigError: A record runs past the end of ``body``.
    """
    view = memoryview(body)
    pos, end = 0, len(body)
    unpack = _HEADER.unpack_from
    size = _HEADER.size
    while pos < end:
        if pos + size > end:
            raise ConfigError("truncated seed record header")
        name_len, data_len = unpack(view, pos)
        pos += size
        stop = pos + name_len + data_len
        if stop > end:
            raise ConfigError("truncated seed record")
        name = bytes(view[pos : pos + name_len]).decode()
        yield name, bytes(view[pos + name_len : stop])
        pos = stop


def generated_bytes(name: str, size: int, seed: int = 0) -> bytes:
    """The deterministic contents of a generated object.

    Args:
        name: The object's name.
        size: Its size in bytes.
        seed: The generator seed.
    """
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=32).digest()
    reps = size // 32 + 1
    return (digest * reps)[:size]


def generated_names(prefix: str, count: int, names: str = "sequential", seed: int = 0) -> list[str]:
    """Names of generated objects: ``prefix`` + a zero-padded index or a hash."""
    if names == "sequential":
        width = max(8, len(str(max(count - 1, 0))))
        return [f"{prefix}{i:0{width}d}" for i in range(count)]
    if names == "hashed":
        return [
            prefix + hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).hexdigest()
            for i in range(count)
        ]
    raise ConfigError(f"names must be 'sequential' or 'hashed', got {names!r}")


def generated_objects(spec: Mapping[str, Any]) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` pairs described by a generator spec.

    Args:
        spec: ``{"prefix": str, "count": int, "size": int, "names":
            "sequential" | "hashed", "seed": int}``; ``prefix``, ``names`` and
            ``seed`` are optional.

    Raises:
        ConfigError: A missing or bad field.
    """
    unknown = set(spec) - {"prefix", "count", "size", "names", "seed"}
    if unknown:
        raise ConfigError(f"unknown seed spec fields {sorted(unknown)}")
    try:
        count = int(spec["count"])
        size = int(spec["size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"seed spec needs integer count and size: {exc}") from exc
    if count < 0 or size < 0:
        raise ConfigError("seed spec count and size must be >= 0")
    seed = int(spec.get("seed", 0))
    names = generated_names(
        str(spec.get("prefix", "")), count, str(spec.get("names", "sequential")), seed
    )
    for name in names:
        yield name, generated_bytes(name, size, seed)
