"""The tar format of the saved form: POSIX ustar headers with pax extended headers, strictly.

Writing makes one member's header blocks (an extended header only where a
name, a link or a size needs one). Reading walks headers over one buffer and
refuses, naming the member, whatever the saved form never holds: a bad
checksum, a non-POSIX header, GNU and sparse extensions, devices and fifos,
extended records it does not know, bytes in padding or after the end, and
any truncation. What the members must say is ``_archive``'s to check.
"""

from __future__ import annotations

import re

import attrs

from ...errors import SnapshotError
from ._manifest import EntryKind, show

__all__ = [
    "BLOCK",
    "KIND_OF_FLAG",
    "MAX_END_PADDING",
    "MAX_PAX_BYTES",
    "TYPEFLAGS",
    "Member",
    "Reader",
    "member_header",
    "pad",
]

BLOCK = 512

#: An extended header's records: a path and a link target (each ``tree/`` and at most 4096
#: bytes, with their lengths and keys), a size and a charset fit in 18 blocks.
MAX_PAX_BYTES = 18 * BLOCK
#: What other writers may end an archive with after its two zero blocks: a 10 KiB record.
MAX_END_PADDING = 20 * BLOCK

TYPEFLAGS = {
    EntryKind.FILE: b"0",
    EntryKind.DIR: b"5",
    EntryKind.SYMLINK: b"2",
    EntryKind.HARDLINK: b"1",
}
KIND_OF_FLAG = {flag: kind for kind, flag in TYPEFLAGS.items()} | {b"\0": EntryKind.FILE}
_REFUSED_FLAGS = {
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a fifo",
    b"7": "a contiguous file",
    b"g": "a global pax header",
    b"L": "a GNU long name",
    b"K": "a GNU long link name",
    b"S": "a GNU sparse file",
}
#: Pax records the reader takes; the ones it ignores change nothing it writes.
_PAX_TAKEN = frozenset({b"path", b"linkpath", b"size"})
_PAX_IGNORED = frozenset(
    {b"hdrcharset", b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname"}
)
_USTAR_MAGIC = b"ustar\x0000"
_ZEROS = bytes(BLOCK)
_OCTAL = re.compile(rb" *([0-7]{1,12})[ \0]*")


def pad(size: int) -> bytes:
    """The zeros that pad ``size`` bytes of data to a whole block."""
    return b"\0" * (-size % BLOCK)


def _record(key: bytes, value: bytes) -> bytes:
    # A record's length counts its own digits.
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + len(str(len(body)))
    if len(str(length)) != len(str(len(body))):
        length += 1
    return str(length).encode() + body


def _ustar(name: bytes, flag: bytes, mode: int, size: int, link: bytes = b"") -> bytes:
    header = bytearray(BLOCK)
    header[0 : len(name)] = name
    header[100:108] = b"%07o\0" % mode
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"00000000000\0"
    header[148:156] = b" " * 8
    header[156:157] = flag
    header[157 : 157 + len(link)] = link
    header[257:265] = _USTAR_MAGIC
    header[329:337] = b"0000000\0"
    header[337:345] = b"0000000\0"
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _fits(field: bytes) -> bool:
    return len(field) <= 100 and field.isascii()


def member_header(name: bytes, flag: bytes, mode: int, size: int, link: bytes = b"") -> bytes:
    """A member's header blocks: an extended header first when a name, link or size needs one."""
    records = []
    if not _fits(link):
        records.append(_record(b"linkpath", link))
    if not _fits(name):
        records.append(_record(b"path", name))
    if size >= 8**11:
        records.append(_record(b"size", str(size).encode()))
    short_size = size if size < 8**11 else 0
    main = _ustar(name[:100], flag, mode, short_size, link[:100])
    if not records:
        return main
    try:
        (name + link).decode("utf-8")
    except UnicodeDecodeError:
        records.insert(0, _record(b"hdrcharset", b"BINARY"))
    body = b"".join(records)
    return _ustar(b"././@PaxHeader", b"x", 0o644, len(body)) + body + pad(len(body)) + main


@attrs.frozen
class Member:
    """One member's header as read: where its data starts and what it claims."""

    number: int
    name: bytes
    flag: bytes
    mode: int
    size: int
    link: bytes
    data: int


def _octal(field: bytes, what: str, number: int) -> int:
    match = _OCTAL.fullmatch(field)
    if match is None:
        raise SnapshotError(f"member {number}: its {what} field is not an octal number")
    return int(match[1], 8)


def _pax_records(body: bytes, number: int) -> dict[bytes, bytes]:
    records: dict[bytes, bytes] = {}
    at = 0
    while at < len(body):
        space = body.find(b" ", at, at + 20)
        length_text = body[at:space] if space > at else b""
        if not length_text.isdigit():
            raise SnapshotError(f"member {number}: a malformed extended header")
        end = at + int(length_text)
        record = body[space + 1 : end]
        if end > len(body) or not record.endswith(b"\n") or b"=" not in record:
            raise SnapshotError(f"member {number}: a malformed extended header")
        key, _, value = record[:-1].partition(b"=")
        if key in _PAX_TAKEN:
            records[key] = value
        elif key not in _PAX_IGNORED:
            raise SnapshotError(
                f"member {number}: extended header record {show(key)}, which a snapshot has not"
            )
        at = end
    if at != len(body):
        raise SnapshotError(f"member {number}: a malformed extended header")
    return records


class Reader:
    """Walks an archive's headers over one buffer; every problem raises naming the member."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.at = 0
        self.number = 0

    def _skip(self, size: int) -> None:
        """Step over ``size`` bytes of data and the zeros that pad them to a block."""
        end = self.at + size
        padded = end + (-size % BLOCK)
        if padded > len(self.view):
            raise SnapshotError(f"truncated: the archive ends inside member {self.number}'s data")
        # Padding carries nothing, so a change there is a change to the archive: refused.
        if self.view[end:padded] != _ZEROS[: padded - end]:
            raise SnapshotError(f"member {self.number}: bytes in its padding (tampered)")
        self.at = padded

    def _block(self) -> bytes:
        block = bytes(self.view[self.at : self.at + BLOCK])
        if len(block) < BLOCK:
            raise SnapshotError(f"truncated: the archive ends inside member {self.number}'s header")
        self.at += BLOCK
        return block

    def header(self, block: bytes) -> tuple[bytes, int, int, bytes, bytes]:
        number = self.number
        if block[257:265] != _USTAR_MAGIC:
            raise SnapshotError(f"member {number}: not a POSIX ustar header")
        stored = _octal(block[148:156], "checksum", number)
        if stored != sum(block[:148]) + 8 * 32 + sum(block[156:]):
            raise SnapshotError(f"member {number}: header checksum mismatch (tampered or damaged)")
        if block[124] & 0x80:
            raise SnapshotError(f"member {number}: a base-256 size, which a snapshot has not")
        name = block[0:100].split(b"\0", 1)[0]
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
        return (
            name,
            _octal(block[100:108], "mode", number),
            _octal(block[124:136], "size", number),
            block[156:157],
            block[157:257].split(b"\0", 1)[0],
        )

    def next(self) -> Member | None:
        """The next member, or None at the archive's end (two zero blocks)."""
        self.number += 1
        block = self._block()
        if block == _ZEROS:
            self._end()
            return None
        name, mode, size, flag, link = self.header(block)
        if flag == b"x":
            if size > MAX_PAX_BYTES:
                raise SnapshotError(f"member {self.number}: an extended header of {size} bytes")
            body = bytes(self.view[self.at : self.at + size])
            self._skip(size)
            records = _pax_records(body, self.number)
            block = self._block()
            if block == _ZEROS:
                raise SnapshotError(f"member {self.number}: an extended header before the end")
            name, mode, size, flag, link = self.header(block)
            if flag == b"x":
                raise SnapshotError(f"member {self.number}: two extended headers in a row")
            name = records.get(b"path", name)
            link = records.get(b"linkpath", link)
            if b"size" in records:
                if not records[b"size"].isdigit():
                    raise SnapshotError(f"member {self.number}: its size record is not a number")
                size = int(records[b"size"])
        if flag in _REFUSED_FLAGS:
            raise SnapshotError(
                f"member {self.number} {show(name)} is {_REFUSED_FLAGS[flag]}, "
                "which a snapshot does not keep"
            )
        if flag not in KIND_OF_FLAG:
            raise SnapshotError(f"member {self.number} {show(name)}: unknown type {flag!r}")
        data = self.at
        # Links and folders carry no data, whatever their header claims.
        if KIND_OF_FLAG[flag] is EntryKind.FILE:
            if data + size > len(self.view):
                raise SnapshotError(
                    f"truncated: member {self.number} {show(name)} claims {size} bytes "
                    f"and the archive holds {max(len(self.view) - data, 0)} after its header"
                )
            self._skip(size)
        elif size:
            raise SnapshotError(f"member {self.number} {show(name)}: a size on a link or a folder")
        return Member(self.number, name, flag, mode, size, link, data)

    def _end(self) -> None:
        rest = self.view[self.at :]
        if len(rest) < BLOCK:
            raise SnapshotError("truncated: the archive ends inside its end marker")
        if len(rest) > BLOCK + MAX_END_PADDING or any(bytes(rest)):
            raise SnapshotError("data after the archive's end (tampered)")
