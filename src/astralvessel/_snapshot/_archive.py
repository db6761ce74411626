"""The saved form: a POSIX pax tar whose first member is the manifest, written and read checked.

The archive holds ``manifest.json`` and then one member per entry, named
``tree/`` and the entry's name, in the manifest's order; owners are not kept
(uid and gid 0, no user or group names), nor times (every mtime is 0), so the
same tree always gives the same bytes. The reader takes only that shape: it
checks every member against the manifest (name, kind, mode, size, link
target, the bytes' digest) and the archive's end before it writes any file,
and then writes only fresh names under ``dest``, never through a link. Any
refusal raises ``SnapshotError`` naming the member and leaves ``dest`` as it
found it (removed if it made it).
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import attrs

from ..errors import SnapshotError, UsageError
from ._manifest import Entry, EntryKind, Manifest, check_name, show
from ._tree import CHUNK

__all__ = ["archive_limit", "extract_archive", "read_manifest", "write_archive"]

BLOCK = 512
MANIFEST_MEMBER = b"manifest.json"
TREE = b"tree/"
#: A manifest's bytes per entry at most (names are at most 4096 bytes; a typical entry is 200).
MANIFEST_BYTES_PER_ENTRY = 4096
#: The most any manifest may take, whatever ``max_files`` says: a JSON parse is in memory.
MAX_MANIFEST_BYTES = 256 << 20
#: An extended header's records: a path and a link target (each ``tree/`` and at most 4096
#: bytes, with their lengths and keys), a size and a charset fit in 18 blocks.
MAX_PAX_BYTES = 18 * BLOCK
#: What other writers may end an archive with after its two zero blocks: a 10 KiB record.
MAX_END_PADDING = 20 * BLOCK

_TYPEFLAGS = {
    EntryKind.FILE: b"0",
    EntryKind.DIR: b"5",
    EntryKind.SYMLINK: b"2",
    EntryKind.HARDLINK: b"1",
}
_KIND_OF_FLAG = {flag: kind for kind, flag in _TYPEFLAGS.items()} | {b"\0": EntryKind.FILE}
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


def manifest_limit(max_files: int) -> int:
    """The largest manifest a tree of ``max_files`` entries may have."""
    return min(MAX_MANIFEST_BYTES, BLOCK + MANIFEST_BYTES_PER_ENTRY * max(max_files, 0))


def archive_limit(max_bytes: int, max_files: int) -> int:
    """The largest archive of a tree within these bounds (what a stream is spooled up to)."""
    pax = BLOCK + MAX_PAX_BYTES
    per_member = 2 * BLOCK + pax
    return (
        manifest_limit(max_files)
        + per_member
        + max_bytes
        + max_files * (per_member + BLOCK)
        + 2 * BLOCK
        + MAX_END_PADDING
    )


# -- writing ------------------------------------------------------------------------------


def _pad(size: int) -> bytes:
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
    return _ustar(b"././@PaxHeader", b"x", 0o644, len(body)) + body + _pad(len(body)) + main


def _member_name(entry: Entry) -> bytes:
    return TREE + entry.name + (b"/" if entry.kind is EntryKind.DIR else b"")


def _member_link(entry: Entry) -> bytes:
    """A member's link field: a symlink's target as written, a hard link's member name."""
    target = entry.target or b""
    return TREE + target if entry.kind is EntryKind.HARDLINK else target


def _copy_file(root: bytes, entry: Entry, out: BinaryIO) -> None:
    path = root + b"/" + entry.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise SnapshotError(f"{show(entry.name)} cannot be read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{show(entry.name)} is no longer a regular file")
        digest = hashlib.sha256()
        left = entry.size
        while left:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
            left -= len(chunk)
        if left or os.read(fd, 1) or digest.hexdigest() != entry.digest:
            raise SnapshotError(f"{show(entry.name)} changed since its manifest was made")
    finally:
        os.close(fd)
    out.write(_pad(entry.size))


def write_archive(root: Path, manifest: Manifest, out: BinaryIO) -> None:
    """Write the saved form of the tree at ``root``, which ``manifest`` describes, to ``out``.

    Raises ``SnapshotError`` when a file no longer matches its entry (the tree
    changed after it was scanned); ``out`` then holds a partial archive, which
    the reader refuses as truncated.
    """
    data = manifest.to_json()
    out.write(member_header(MANIFEST_MEMBER, b"0", 0o644, len(data)) + data + _pad(len(data)))
    base = os.fsencode(root)
    for entry in manifest.entries:
        kind = entry.kind
        link = _member_link(entry)
        out.write(
            member_header(_member_name(entry), _TYPEFLAGS[kind], entry.mode, entry.size, link)
        )
        if kind is EntryKind.FILE:
            _copy_file(base, entry, out)
    out.write(b"\0" * (2 * BLOCK))


# -- reading ------------------------------------------------------------------------------


@attrs.frozen
class _Member:
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


class _Reader:
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

    def _header(self, block: bytes) -> tuple[bytes, int, int, bytes, bytes]:
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

    def next(self) -> _Member | None:
        """The next member, or None at the archive's end (two zero blocks)."""
        self.number += 1
        block = self._block()
        if block == _ZEROS:
            self._end()
            return None
        name, mode, size, flag, link = self._header(block)
        if flag == b"x":
            if size > MAX_PAX_BYTES:
                raise SnapshotError(f"member {self.number}: an extended header of {size} bytes")
            body = bytes(self.view[self.at : self.at + size])
            self._skip(size)
            records = _pax_records(body, self.number)
            block = self._block()
            if block == _ZEROS:
                raise SnapshotError(f"member {self.number}: an extended header before the end")
            name, mode, size, flag, link = self._header(block)
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
        if flag not in _KIND_OF_FLAG:
            raise SnapshotError(f"member {self.number} {show(name)}: unknown type {flag!r}")
        data = self.at
        # Links and folders carry no data, whatever their header claims.
        if _KIND_OF_FLAG[flag] is EntryKind.FILE:
            if data + size > len(self.view):
                raise SnapshotError(
                    f"truncated: member {self.number} {show(name)} claims {size} bytes "
                    f"and the archive holds {max(len(self.view) - data, 0)} after its header"
                )
            self._skip(size)
        elif size:
            raise SnapshotError(f"member {self.number} {show(name)}: a size on a link or a folder")
        return _Member(self.number, name, flag, mode, size, link, data)

    def _end(self) -> None:
        rest = self.view[self.at :]
        if len(rest) < BLOCK:
            raise SnapshotError("truncated: the archive ends inside its end marker")
        if len(rest) > BLOCK + MAX_END_PADDING or any(bytes(rest)):
            raise SnapshotError("data after the archive's end (tampered)")

    def manifest(self, limit: int) -> Manifest:
        """The first member, which must be the manifest, parsed and checked."""
        member = self.next()
        if member is None or member.name != MANIFEST_MEMBER or member.flag not in (b"0", b"\0"):
            raise SnapshotError("not a snapshot: the first member is not manifest.json")
        if member.size > limit:
            raise SnapshotError(f"the manifest's {member.size} bytes are past the bound ({limit})")
        return Manifest.from_json(bytes(self.view[member.data : member.data + member.size]))


def _check_member(member: _Member, entry: Entry, view: memoryview) -> None:
    number, name = member.number, member.name
    if _KIND_OF_FLAG[member.flag] is EntryKind.DIR and name.endswith(b"/"):
        name = name[:-1]
    if not name.startswith(TREE):
        raise SnapshotError(f"member {number} {show(name)} is not under tree/")
    relative = name[len(TREE) :]
    if relative != entry.name:
        # The entry's name passed every check when the manifest was read; say what is
        # wrong with the member's own name, when something is, before it differs.
        problem = check_name(relative)
        if problem is not None:
            raise SnapshotError(f"member {number} {show(name)}: {problem}")
        raise SnapshotError(
            f"member {number} is {show(relative)} where the manifest lists {show(entry.name)}"
        )
    kind = _KIND_OF_FLAG[member.flag]
    if kind is not entry.kind:
        raise SnapshotError(
            f"member {number} {show(relative)} is a {kind.value}; "
            f"the manifest says {entry.kind.value}"
        )
    if member.mode != entry.mode:
        raise SnapshotError(
            f"member {number} {show(relative)} has mode {member.mode:#o}; "
            f"the manifest says {entry.mode:#o}"
        )
    if member.size != entry.size:
        raise SnapshotError(
            f"member {number} {show(relative)} holds {member.size} bytes; "
            f"the manifest says {entry.size}"
        )
    if member.link != _member_link(entry):
        raise SnapshotError(f"member {number} {show(relative)} links elsewhere than its entry says")
    if kind is EntryKind.FILE:
        digest = hashlib.sha256(view[member.data : member.data + member.size]).hexdigest()
        if digest != entry.digest:
            raise SnapshotError(
                f"member {number} {show(relative)}: its bytes do not match their digest (tampered)"
            )


def _check_archive(view: memoryview, max_bytes: int, max_files: int) -> tuple[Manifest, list[int]]:
    """Every check of the archive, before anything is written: the manifest and each data offset."""
    reader = _Reader(view)
    manifest = reader.manifest(manifest_limit(max_files))
    if manifest.file_count > max_files:
        raise SnapshotError(
            f"the snapshot has {manifest.file_count} entries, past max_files={max_files}"
        )
    if manifest.total_bytes > max_bytes:
        raise SnapshotError(
            f"the snapshot holds {manifest.total_bytes} bytes, past max_bytes={max_bytes}"
        )
    offsets = []
    for entry in manifest.entries:
        member = reader.next()
        if member is None:
            raise SnapshotError(
                f"the archive ends before entry {show(entry.name)} "
                "(truncated, or the manifest lists more than the archive holds)"
            )
        _check_member(member, entry, view)
        offsets.append(member.data)
    extra = reader.next()
    if extra is not None:
        raise SnapshotError(
            f"member {extra.number} {show(extra.name)} is not in the manifest (tampered)"
        )
    return manifest, offsets


@contextmanager
def _buffer(src: BinaryIO, limit: int) -> Iterator[memoryview]:
    """The archive's bytes from the stream's position on: mapped, or spooled within ``limit``."""
    if isinstance(src, io.BytesIO):
        with src.getbuffer() as whole:
            view = whole[src.tell() :]
            if len(view) > limit:
                view.release()
                raise SnapshotError(f"the archive is larger than its bounds allow ({limit} bytes)")
            try:
                yield view
            finally:
                view.release()
        return
    try:
        fd = src.fileno()
        start = src.tell()
        mappable = stat.S_ISREG(os.fstat(fd).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        mappable = False
    if mappable:
        yield from _mapped(fd, start, limit)
        return
    with tempfile.TemporaryFile() as spool:
        copied = 0
        while chunk := src.read(CHUNK):
            copied += len(chunk)
            if copied > limit:
                raise SnapshotError(f"the archive is larger than its bounds allow ({limit} bytes)")
            spool.write(chunk)
        spool.flush()
        yield from _mapped(spool.fileno(), 0, limit)


def _mapped(fd: int, start: int, limit: int) -> Iterator[memoryview]:
    size = os.fstat(fd).st_size - start
    if size > limit:
        raise SnapshotError(f"the archive is larger than its bounds allow ({limit} bytes)")
    if size <= 0:
        raise SnapshotError("truncated: the archive is empty")
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapping, memoryview(mapping) as whole:
        view = whole[start:]
        try:
            yield view
        finally:
            view.release()


def read_manifest(src: BinaryIO) -> Manifest:
    """The manifest at the start of a saved snapshot, checked on its own (not the members)."""
    head = src.read(BLOCK)
    reader = _Reader(memoryview(head))
    try:
        name, _, size, flag, _ = (
            reader._header(head) if len(head) == BLOCK else (b"", 0, 0, b"", b"")
        )
    except SnapshotError:
        raise SnapshotError("not a snapshot: the first member is not manifest.json") from None
    if name != MANIFEST_MEMBER or flag not in (b"0", b"\0"):
        raise SnapshotError("not a snapshot: the first member is not manifest.json")
    if size > MAX_MANIFEST_BYTES:
        raise SnapshotError(
            f"the manifest's {size} bytes are past the bound ({MAX_MANIFEST_BYTES})"
        )
    data = src.read(size)
    if len(data) < size:
        raise SnapshotError("truncated: the archive ends inside its manifest")
    return Manifest.from_json(data)


def _prepare(dest: Path) -> tuple[int, bool]:
    """Open ``dest``, made here or an empty folder already; its descriptor and whether it was made.

    Everything is then written relative to this descriptor, so a name never
    resolves through another path to the folder than the one checked here.
    """
    made = True
    try:
        os.mkdir(dest, 0o700)
    except FileExistsError:
        made = False
    except FileNotFoundError:
        raise UsageError(f"dest {str(dest)!r}: its parent folder does not exist") from None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(dest, flags)
    except OSError:
        fd = -1
    if fd < 0 or (not made and os.listdir(fd)):
        if fd >= 0:
            os.close(fd)
        raise UsageError(f"dest {str(dest)!r} must be an empty folder or not exist")
    return fd, made


def _umask() -> int:
    """This process's umask, read without changing it (the umask call sets it for every thread)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o777  # unknown: every mode is then set explicitly


def _write_file(base: int, name: bytes, view: memoryview, mode: int, umask: int) -> None:
    # Created with its own mode (the new descriptor may write whatever the mode): one
    # fchmod fewer per file unless the umask takes bits the entry keeps.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=base)
    try:
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        if mode & umask:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _write_tree(
    view: memoryview, manifest: Manifest, offsets: list[int], base: int, folders: list[bytes]
) -> None:
    """Write every entry under the folder ``base``, adding each folder made to ``folders``.

    Entries come in canonical order, so each folder is made before anything in
    it and a hard link's file before the link. A folder its owner cannot write
    into gets its mode last, deepest first, once its children are in.
    """
    umask = _umask()
    modes: list[tuple[bytes, int]] = []
    for entry, data in zip(manifest.entries, offsets, strict=True):
        name = entry.name
        kind = entry.kind
        if kind is EntryKind.FILE:
            _write_file(base, name, view[data : data + entry.size], entry.mode, umask)
        elif kind is EntryKind.DIR:
            exact = entry.mode & 0o300 == 0o300 and not entry.mode & umask
            os.mkdir(name, entry.mode if exact else 0o700, dir_fd=base)
            folders.append(name)
            if not exact:
                modes.append((name, entry.mode))
        elif kind is EntryKind.SYMLINK:
            os.symlink(entry.target or b"", name, dir_fd=base)
        else:
            target = entry.target or b""
            os.link(target, name, src_dir_fd=base, dst_dir_fd=base, follow_symlinks=False)
    for name, mode in reversed(modes):
        os.chmod(name, mode, dir_fd=base)


def _undo(dest: Path, made_dest: bool, base: int, folders: list[bytes]) -> None:
    # Folders may have lost their write bit already; give it back so they can be emptied.
    for folder in folders:
        os.chmod(folder, 0o700, dir_fd=base)
    if made_dest:
        shutil.rmtree(dest)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def extract_archive(src: BinaryIO, dest: Path, *, max_bytes: int, max_files: int) -> Manifest:
    """Check a saved snapshot whole, then write its tree into ``dest``; return its manifest.

    ``src`` is read from its position to its end; a stream that cannot be
    mapped is spooled to a temporary file, no further than the bounds allow.
    ``dest`` must be an empty folder or not exist, in a folder that does
    (``UsageError`` otherwise). Raises ``SnapshotError`` naming the problem for
    an archive that is truncated, tampered or hostile, or past ``max_bytes``
    (regular files' bytes) or ``max_files`` (entries); nothing is then written.
    """
    with _buffer(src, archive_limit(max_bytes, max_files)) as view:
        manifest, offsets = _check_archive(view, max_bytes, max_files)
        base, made_dest = _prepare(dest)
        folders: list[bytes] = []
        try:
            _write_tree(view, manifest, offsets, base, folders)
        except BaseException as exc:
            _undo(dest, made_dest, base, folders)
            if isinstance(exc, OSError):
                raise SnapshotError(f"the snapshot cannot be written: {exc}") from exc
            raise
        finally:
            os.close(base)
    return manifest
