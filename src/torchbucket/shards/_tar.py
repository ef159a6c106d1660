"""The tar layout of a shard: deterministic headers to write, a streaming header parser.

A shard is a POSIX tar (pax where a name needs it) whose members are
``<key>.<ext>``, the members of one key adjacent: the WebDataset layout.
Headers are written with fixed metadata (mtime 0, mode 0644, uid/gid 0, no
user names), so the same input gives byte-identical shards. The parser reads
the headers of any tar the stdlib ``tarfile`` writes (ustar, GNU long names,
pax), which covers the ``webdataset`` package's ``ShardWriter``.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "HeaderError",
    "TarMember",
    "member_header",
    "padding",
    "parse_header",
    "parse_pax",
    "split_key",
]

BLOCK = 512
#: Two zero blocks end an archive.
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_ZERO_BLOCK = b"\0" * BLOCK

# WebDataset's rule: the key is the path up to the first dot of the last
# path segment, the extension everything after it (``a/b.c/x.seg.png`` ->
# ``a/b.c/x``, ``seg.png``). A segment that starts with a dot has no key.
_KEY_RE = re.compile(r"^((?:.*/|)[^./][^.]*)[.]([^/]*)$", re.DOTALL)

_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


class HeaderError(ValueError):
    """A block that is not a tar header (bad checksum, garbage)."""


def split_key(name: str) -> tuple[str, str] | None:
    """``"dir/0001.seg.png"`` -> ``("dir/0001", "seg.png")``; ``None`` without an extension."""
    match = _KEY_RE.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2)


def padding(size: int) -> int:
    """Zero bytes after ``size`` bytes of data, up to the next block."""
    return -size % BLOCK


def member_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular file member, the same for the same input.

    Names longer than ustar holds (or not ASCII) get a pax ``path`` record.
    """
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


@dataclass(frozen=True, slots=True)
class TarMember:
    """One header as read: its name, type, and the size of the data after it.

    Attributes:
        name: The member's name (before any pax or GNU long-name override).
        kind: ``"file"``, ``"pax"`` (extended header for the next member),
            ``"global"`` (pax global header), ``"longname"`` (GNU long name of
            the next member) or ``"other"`` (directories, links...).
        size: Bytes of data that follow the header.
    """

    name: str
    kind: str
    size: int


def parse_header(block: bytes) -> TarMember | None:
    """One 512-byte header block; ``None`` for a zero block (the end of the archive).

    Raises:
        HeaderError: The block is not a valid header.
    """
    if block == _ZERO_BLOCK:
        return None
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as exc:
        raise HeaderError(str(exc) or type(exc).__name__) from exc
    kind = "other"
    if info.type in _FILE_TYPES:
        kind = "file"
    elif info.type == tarfile.XHDTYPE:
        kind = "pax"
    elif info.type == tarfile.XGLTYPE:
        kind = "global"
    elif info.type == tarfile.GNUTYPE_LONGNAME:
        kind = "longname"
    return TarMember(info.name, kind, info.size)


def parse_pax(payload: bytes) -> dict[str, str]:
    """The records of a pax extended header (``"<len> <key>=<value>\\n"`` each).

    Raises:
        HeaderError: A record is malformed.
    """
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload) and payload[pos] != 0:
        space = payload.find(b" ", pos)
        if space < 0:
            raise HeaderError("malformed pax record")
        try:
            length = int(payload[pos:space])
        except ValueError:
            raise HeaderError("malformed pax record length") from None
        if length <= 0 or pos + length > len(payload):
            raise HeaderError("pax record runs past its header")
        record = payload[space + 1 : pos + length - 1]
        key, sep, value = record.partition(b"=")
        if not sep:
            raise HeaderError("pax record without '='")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records
