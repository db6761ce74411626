"""Scan a host folder into a manifest, without following any link.

Regular files, folders, symlinks and hard links are kept; a device, a fifo or
a socket is refused. A symlink's target is kept as written, even one that
points out of the tree: the tree is a sandbox's files, where the link resolves
in the sandbox's own root (a virtualenv's ``bin/python`` names the system's),
and the host never follows it (``_archive`` writes and reads without following
links). Set-id bits are dropped, with a note. A sparse file is kept as its
bytes, holes read as zeros, and counts its full size against ``max_bytes``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ...errors import SnapshotError
from ._manifest import KEPT_MODE_BITS, SETID_BITS, Entry, EntryKind, Manifest, show

__all__ = ["hash_file", "open_regular", "scan_tree"]

#: Read files in chunks this big: few system calls, little memory.
CHUNK = 1 << 20
#: The path a frozen layer held by descriptor has (``Tree.held_layer``): its number follows.
HELD_PREFIX = b"/proc/self/fd/"
#: How many names a set-id note lists before it only counts.
NOTE_NAMES = 5

_REFUSED = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a fifo",
    stat.S_IFSOCK: "a socket",
}


def hash_file(fd: int, size: int, name: bytes) -> str:
    """The sha256 of the ``size`` bytes an open file holds; SnapshotError if it holds others."""
    digest = hashlib.sha256()
    left = size
    while left:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            break
        digest.update(chunk)
        left -= len(chunk)
    if left or os.read(fd, 1):
        raise SnapshotError(f"{show(name)} changed size while it was read")
    return digest.hexdigest()


def open_regular(path: bytes, name: bytes, *, replaced: str) -> int:
    """A descriptor to read the regular file at ``path``, opened without following a link.

    Raises ``SnapshotError`` naming ``name`` when it cannot be opened, or when what
    was opened is not a regular file (``replaced`` says how the caller puts that).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise SnapshotError(f"{show(name)} cannot be read: {exc.strerror}") from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise SnapshotError(f"{show(name)} {replaced}")
    return fd


def _read_digest(path: bytes, name: bytes, size: int) -> str:
    fd = open_regular(path, name, replaced="was replaced while it was read")
    try:
        return hash_file(fd, size, name)
    finally:
        os.close(fd)


class _Scan:
    """One walk's running state: the entries, the bounds, the hard links seen."""

    def __init__(self, root: bytes, max_bytes: int, max_files: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.entries: list[Entry] = []
        self.seen = 0
        self.total = 0
        self.setid: list[bytes] = []
        # (device, inode) of each regular file with other links, to its first name.
        self.inodes: dict[tuple[int, int], bytes] = {}
        self.later_links: list[tuple[bytes, tuple[int, int], int]] = []
        # Folders met and not yet listed: the walk is iterative, so a tree nested as deep as
        # a name may go (2000 folders) costs no stack.
        self.pending: list[bytes] = []

    def walk_all(self) -> None:
        self.pending.append(b"")
        while self.pending:
            self.walk(self.pending.pop())

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def walk(self, folder: bytes) -> None:
        path = self.root + b"/" + folder if folder else self.root
        try:
            listing = list(os.scandir(path))
        except OSError as exc:
            raise SnapshotError(
                f"{show(folder or b'.')} cannot be listed: {exc.strerror}"
            ) from None
        for item in listing:
            name = folder + b"/" + item.name if folder else item.name
            try:
                info = item.stat(follow_symlinks=False)
            except OSError as exc:
                raise SnapshotError(f"{show(name)} cannot be read: {exc.strerror}") from None
            self.visit(name, info)

    def visit(self, name: bytes, info: os.stat_result) -> None:
        # Counted as met, hard links too (their entries are made after the walk).
        self.seen += 1
        if self.seen > self.max_files:
            raise SnapshotError(f"the tree has more than max_files={self.max_files} entries")
        fmt = stat.S_IFMT(info.st_mode)
        if fmt in _REFUSED:
            raise SnapshotError(f"{show(name)} is {_REFUSED[fmt]}, which a snapshot does not keep")
        mode = stat.S_IMODE(info.st_mode)
        if mode & SETID_BITS:
            self.setid.append(name)
        mode &= KEPT_MODE_BITS
        if fmt == stat.S_IFDIR:
            self.add(Entry(name=name, kind=EntryKind.DIR, mode=mode))
            self.pending.append(name)
        elif fmt == stat.S_IFLNK:
            try:
                target = os.readlink(self.root + b"/" + name)
            except OSError as exc:
                raise SnapshotError(f"{show(name)} cannot be read: {exc.strerror}") from None
            self.add(Entry(name=name, kind=EntryKind.SYMLINK, mode=0o777, target=target))
        elif info.st_nlink > 1:
            # Decided after the walk: the first name in canonical order holds the bytes.
            self.later_links.append((name, (info.st_dev, info.st_ino), mode))
            self.count_bytes(name, info.st_size, key=(info.st_dev, info.st_ino))
        else:
            self.add_file(name, mode, info.st_size)

    def count_bytes(self, name: bytes, size: int, key: tuple[int, int] | None = None) -> None:
        if key is not None:
            if key in self.inodes:
                return
            self.inodes[key] = name
        self.total += size
        if self.total > self.max_bytes:
            raise SnapshotError(f"the tree holds more than max_bytes={self.max_bytes} bytes")

    def add_file(self, name: bytes, mode: int, size: int, counted: bool = False) -> None:
        if not counted:
            self.count_bytes(name, size)
        digest = _read_digest(self.root + b"/" + name, name, size)
        self.add(Entry(name=name, kind=EntryKind.FILE, mode=mode, size=size, digest=digest))

    def link_groups(self) -> None:
        """Each set of hard-linked names: the first in canonical order a file, the rest links."""
        firsts: dict[tuple[int, int], bytes] = {}
        for name, key, mode in sorted(self.later_links):
            first = firsts.get(key)
            if first is None:
                firsts[key] = name
                size = os.lstat(self.root + b"/" + name).st_size
                self.add_file(name, mode, size, counted=True)
            else:
                self.add(Entry(name=name, kind=EntryKind.HARDLINK, mode=mode, target=first))

    def notes(self) -> tuple[str, ...]:
        if not self.setid:
            return ()
        names = ", ".join(show(name) for name in sorted(self.setid)[:NOTE_NAMES])
        more = len(self.setid) - NOTE_NAMES
        return (
            f"set-id bits dropped from {len(self.setid)} "
            f"{'entry' if len(self.setid) == 1 else 'entries'}: {names}"
            + (f" and {more} more" if more > 0 else ""),
        )


def scan_tree(root: Path, *, max_bytes: int, max_files: int) -> Manifest:
    """The manifest of the folder ``root``: every entry under it, hashed, links not followed.

    Raises ``SnapshotError`` for a special file, an unreadable entry, or a tree
    past ``max_bytes`` (regular files' sizes) or ``max_files`` (entries of any
    kind), as soon as the walk meets it.
    """
    base = os.fsencode(root)
    if base.startswith(HELD_PREFIX):
        # A frozen layer the host holds by descriptor (``Tree.held_layer``): its root is
        # that descriptor's link, followed as a folder's name is, never a link of the tree.
        base += b"/."
    try:
        info = os.lstat(base)
    except OSError as exc:
        raise SnapshotError(f"{str(root)!r} cannot be scanned: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise SnapshotError(f"{str(root)!r} is not a folder (a snapshot's root must be one)")
    scan = _Scan(base.rstrip(b"/") or b"/", max_bytes, max_files)
    scan.walk_all()
    scan.link_groups()
    return Manifest.build(scan.entries, scan.notes())
