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
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ...errors import SnapshotError, UsageError
from ._manifest import Entry, EntryKind, Manifest, check_name, show
from ._tar import (
    BLOCK,
    KIND_OF_FLAG,
    MAX_END_PADDING,
    MAX_PAX_BYTES,
    TYPEFLAGS,
    Member,
    Reader,
    member_header,
    pad,
)
from ._tree import CHUNK, open_regular

__all__ = [
    "archive_limit",
    "checked_pieces",
    "extract_archive",
    "read_manifest",
    "write_archive",
]

MANIFEST_MEMBER = b"manifest.json"
TREE = b"tree/"
#: A manifest's bytes per entry at most (names are at most 4096 bytes; a typical entry is 200).
MANIFEST_BYTES_PER_ENTRY = 4096
#: The most any manifest may take, whatever ``max_files`` says: a JSON parse is in memory.
MAX_MANIFEST_BYTES = 256 << 20


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


def _member_name(entry: Entry) -> bytes:
    return TREE + entry.name + (b"/" if entry.kind is EntryKind.DIR else b"")


def _member_link(entry: Entry) -> bytes:
    """A member's link field: a symlink's target as written, a hard link's member name."""
    target = entry.target or b""
    return TREE + target if entry.kind is EntryKind.HARDLINK else target


def checked_pieces(entry: Entry, pieces: Iterable[bytes]) -> Iterator[bytes]:
    """``pieces`` (a file's bytes, in order) passed on as they come, checked against
    ``entry``: refused (``SnapshotError``) at once past its size, and at the end short of
    it or where their sha256 is not its digest. The caller undoes what it wrote of them."""
    digest = hashlib.sha256()
    left = entry.size
    for piece in pieces:
        if len(piece) > left:
            raise SnapshotError(f"{show(entry.name)} changed since its manifest was made")
        digest.update(piece)
        left -= len(piece)
        yield piece
    if left or digest.hexdigest() != entry.digest:
        raise SnapshotError(f"{show(entry.name)} changed since its manifest was made")


def _file_pieces(root: bytes, entry: Entry) -> Iterator[bytes]:
    """The file's bytes read from the tree at ``root``, one byte past its size at most."""
    fd = open_regular(root + b"/" + entry.name, entry.name, replaced="is no longer a regular file")
    try:
        left = entry.size + 1
        while left and (chunk := os.read(fd, min(CHUNK, left))):
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


def write_archive(
    root: Path,
    manifest: Manifest,
    out: BinaryIO,
    contents: Iterator[Iterable[bytes]] | None = None,
) -> None:
    """Write the saved form of the tree at ``root``, which ``manifest`` describes, to ``out``.

    ``contents``: where this process cannot read the tree's files (an ordinary user's
    Docker layer, read by the backend's reader), each regular file's bytes in the
    manifest's order, as pieces; checked as the files' own are.

    Raises ``SnapshotError`` when a file no longer matches its entry (the tree
    changed after it was scanned, or ``contents`` sent other bytes); ``out`` then
    holds a partial archive, which the reader refuses as truncated.
    """
    data = manifest.to_json()
    out.write(member_header(MANIFEST_MEMBER, b"0", 0o644, len(data)) + data + pad(len(data)))
    base = os.fsencode(root)
    for entry in manifest.entries:
        kind = entry.kind
        link = _member_link(entry)
        out.write(member_header(_member_name(entry), TYPEFLAGS[kind], entry.mode, entry.size, link))
        if kind is EntryKind.FILE:
            pieces = _file_pieces(base, entry) if contents is None else next(contents)
            for piece in checked_pieces(entry, pieces):
                out.write(piece)
            out.write(pad(entry.size))
    out.write(b"\0" * (2 * BLOCK))


# -- reading ------------------------------------------------------------------------------


def _manifest_member(reader: Reader, limit: int) -> Manifest:
    """The first member, which must be the manifest, parsed and checked."""
    member = reader.next()
    if member is None or member.name != MANIFEST_MEMBER or member.flag not in (b"0", b"\0"):
        raise SnapshotError("not a snapshot: the first member is not manifest.json")
    if member.size > limit:
        raise SnapshotError(f"the manifest's {member.size} bytes are past the bound ({limit})")
    return Manifest.from_json(bytes(reader.view[member.data : member.data + member.size]))


def _check_member(member: Member, entry: Entry, view: memoryview) -> None:
    number, name = member.number, member.name
    if KIND_OF_FLAG[member.flag] is EntryKind.DIR and name.endswith(b"/"):
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
    kind = KIND_OF_FLAG[member.flag]
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
    reader = Reader(view)
    manifest = _manifest_member(reader, manifest_limit(max_files))
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
    reader = Reader(memoryview(head))
    try:
        name, _, size, flag, _ = (
            reader.header(head) if len(head) == BLOCK else (b"", 0, 0, b"", b"")
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
