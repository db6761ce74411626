"""A capture's new tree in the store, written by the host from a checked manifest.

The manifest's invariants (names relative and clean, each under a folder listed
before it, nothing under a link, a hard link's file before it) are what make
writing by name under one folder descriptor safe, as ``_archive`` writes a
loaded tree. A regular file is either linked to a file the store holds already
(``link_held``: a hard link to an older, immutable tree's file, so unchanged
bytes are neither sent, hashed nor stored twice) or written from the bytes the
sandbox sent, hashed as they are written: its digest is of the bytes on disk.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from ...errors import SnapshotError
from ._archive import _umask
from ._manifest import Entry, show
from ._reuse import Held, matches
from ._store import Inodes

__all__ = ["EMPTY_DIGEST", "TreeWriter"]

EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeWriter:
    """Writes one new tree: entries in the manifest's order, folders' modes last."""

    def __init__(self, path: Path) -> None:
        os.mkdir(path, 0o700)
        self.base = os.open(path, _DIR_FLAGS)
        self.umask = _umask()
        #: Each regular file's digest, as it was linked or written.
        self.digests: dict[bytes, str] = {}
        #: Each regular file's inode, as the budget counts it (``_store.Inodes``).
        self.inodes: Inodes = {}
        self._modes: list[tuple[bytes, int]] = []
        self._file: tuple[int, Any] | None = None

    def folder(self, entry: Entry) -> None:
        """Make a folder: private until its files are in unless its mode is exact here."""
        exact = entry.mode & 0o300 == 0o300 and not entry.mode & self.umask
        os.mkdir(entry.name, entry.mode if exact else 0o700, dir_fd=self.base)
        if not exact:
            self._modes.append((entry.name, entry.mode))

    def symlink(self, entry: Entry) -> None:
        """Make a symlink, its target as written (nothing on the host follows it)."""
        os.symlink(entry.target or b"", entry.name, dir_fd=self.base)

    def hard_link(self, entry: Entry) -> None:
        """Link ``entry`` to the earlier file it names, in this tree."""
        target = entry.target or b""
        os.link(
            target, entry.name, src_dir_fd=self.base, dst_dir_fd=self.base, follow_symlinks=False
        )

    def link_held(self, entry: Entry, held: Held) -> bool:
        """Link a held file as ``entry``; False (nothing made) where it cannot serve."""
        if not matches(held, entry):
            return False
        try:
            info = os.lstat(held.path)
        except OSError:
            return False
        key = (info.st_dev, info.st_ino)
        # One held inode per name: two names sharing one would be a hard link the listing
        # did not show.
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size or key in self.inodes:
            return False
        try:
            os.link(held.path, entry.name, dst_dir_fd=self.base, follow_symlinks=False)
        except OSError:  # a folder of the older tree its owner cannot search: read instead
            return False
        self.inodes[key] = entry.size
        self.digests[entry.name] = held.entry.digest or EMPTY_DIGEST
        return True

    def copy(self, entry: Entry, source: int) -> None:
        """Write ``entry`` from the open file ``source`` (a frozen layer's, read-only: its
        bytes are those ``entry.digest`` was made of), copied in the kernel, not hashed
        again; ``SnapshotError`` where it does not hold ``entry.size`` bytes."""
        fd = os.open(entry.name, _NEW_FILE, entry.mode, dir_fd=self.base)
        try:
            offset = 0
            while offset < entry.size:
                sent = os.sendfile(fd, source, offset, entry.size - offset)
                if not sent:
                    raise SnapshotError(f"{show(entry.name)} changed size while it was copied")
                offset += sent
            if entry.mode & self.umask:
                os.fchmod(fd, entry.mode)
            info = os.fstat(fd)
        finally:
            os.close(fd)
        self.inodes[(info.st_dev, info.st_ino)] = entry.size
        self.digests[entry.name] = entry.digest or EMPTY_DIGEST

    def empty(self, entry: Entry) -> None:
        """Make an empty regular file."""
        self.piece(entry, 0, memoryview(b""))

    def piece(self, entry: Entry, offset: int, data: memoryview) -> None:
        """Write the next piece of ``entry``'s bytes (pieces come in order, one file at a time)."""
        if offset == 0:
            fd = os.open(entry.name, _NEW_FILE, entry.mode, dir_fd=self.base)
            self._file = (fd, hashlib.sha256())
        if self._file is None:
            raise RuntimeError(f"a piece of {show(entry.name)} before its first")
        fd, digest = self._file
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        digest.update(data)
        if offset + len(data) == entry.size:
            if entry.mode & self.umask:
                os.fchmod(fd, entry.mode)
            info = os.fstat(fd)
            os.close(fd)
            self.inodes[(info.st_dev, info.st_ino)] = entry.size
            self._file = None
            self.digests[entry.name] = digest.hexdigest()

    def finish(self) -> None:
        """Give folders their modes, deepest first, and close the tree."""
        for name, mode in reversed(self._modes):
            os.chmod(name, mode, dir_fd=self.base)
        self._modes = []
        self.close()

    def close(self) -> None:
        """Close what is open (the tree is then complete, or the caller removes it)."""
        if self._file is not None:
            os.close(self._file[0])
            self._file = None
        if self.base >= 0:
            os.close(self.base)
            self.base = -1
