"""Removing a folder the host made, whatever a sandbox left in it.

A snapshot's tree keeps the folder modes a sandbox made (0555 among them), and
a folder may still be busy for a moment (EBUSY: Docker's lazy unmount of a
copy-on-write workspace over it). ``shutil.rmtree`` alone leaves both, as an
ordinary user for good: the snapshot reaper and the sweep of a dead host's
folders remove through this one routine. ``remove_once`` makes one attempt and
says whether a busy folder is worth another, so a caller with other folders to
remove (the reaper) tries it again later rather than wait on it.

Nothing here follows a link: ``rmtree`` opens each folder without following
one, and the bits are given back with ``follow_symlinks=False``, so a tree's
link to a host file never changes that file.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["remove_folder", "remove_once"]

_BUSY_PAUSE = 0.1


def remove_once(folder: Path) -> bool:
    """One attempt at removing ``folder`` and all under it, folders without write bits too.

    True when there is nothing more to try: the folder is gone, or what failed is not
    its being busy (left for a sweep). False when it is busy (EBUSY): try again later.
    """
    problems = _rmtree(folder)
    if not os.path.lexists(folder):
        return True
    if problems & {errno.EACCES, errno.EPERM}:
        # A tree keeps the folder modes a sandbox made (0555 among them): as their owner
        # the host can give itself the bits back, then try once more.
        _make_writable(folder)
        problems = _rmtree(folder)
        if not os.path.lexists(folder):
            return True
    return errno.EBUSY not in problems


def remove_folder(folder: Path, busy_seconds: float = 0.0) -> None:
    """Remove ``folder`` and all under it, folders without write bits too; a busy one is
    tried again for ``busy_seconds``; anything else that fails is left (a sweep finds it)."""
    deadline = time.monotonic() + busy_seconds
    while not remove_once(folder) and time.monotonic() < deadline:
        time.sleep(_BUSY_PAUSE)


def _rmtree(folder: Path) -> set[int]:
    """``shutil.rmtree`` that goes on past failures; the errnos it met."""
    problems: set[int] = set()

    def failed(_function: Any, _path: Any, error: BaseException) -> None:
        problems.add(getattr(error, "errno", 0))

    def rmtree() -> None:
        if sys.version_info >= (3, 12):
            shutil.rmtree(folder, onexc=failed)
        else:  # onerror, deprecated from 3.12, gives the exception as a tuple
            shutil.rmtree(folder, onerror=lambda fn, path, info: failed(fn, path, info[1]))

    try:
        rmtree()
    except RecursionError:
        # rmtree recurses a frame per level (up to 3.12), and a sandbox may nest a folder
        # per two bytes of a 4096-byte name: cut the tree into shallow pieces, then again.
        problems.clear()
        try:
            _flatten(folder)
        except OSError as exc:
            problems.add(exc.errno or 0)
        rmtree()
    return problems


#: How deep a folder may lie before ``_flatten`` moves it up to the top.
_FLAT_DEPTH = 200
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _flatten(folder: Path) -> None:
    """Move each folder lying ``_FLAT_DEPTH`` deep up to ``folder``'s top, so that nothing
    under it is nested deeper. Iterative, two descriptors at most, no link followed, each
    folder reached a component at a time (a deep one's path passes PATH_MAX)."""
    root = os.open(folder, _DIR_FLAGS)
    try:
        pending, moved = [b""], 0
        while pending:
            path = pending.pop()
            fd = _open_under(root, path)
            try:
                with os.scandir(fd) as entries:
                    names = [
                        os.fsencode(e.name) for e in entries if e.is_dir(follow_symlinks=False)
                    ]
                for name in names:
                    child = path + b"/" + name if path else name
                    if child.count(b"/") + 1 < _FLAT_DEPTH:
                        pending.append(child)
                        continue
                    moved += 1
                    while os.path.lexists(os.path.join(os.fsencode(folder), b".flat-%d" % moved)):
                        moved += 1
                    top = b".flat-%d" % moved
                    os.rename(name, top, src_dir_fd=fd, dst_dir_fd=root)
                    pending.append(top)
            finally:
                os.close(fd)
    finally:
        os.close(root)


def _open_under(root: int, name: bytes) -> int:
    fd = os.open(".", _DIR_FLAGS, dir_fd=root)
    for part in name.split(b"/") if name else ():
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def _make_writable(folder: Path) -> None:
    """Give every folder under ``folder`` (itself too) its owner's bits, following no link.

    Iterative, one folder open at a time: a tree a sandbox made may be nested
    as deep as it liked.
    """
    pending = [os.fsencode(folder)]
    while pending:
        path = pending.pop()
        _owner_bits(path)
        try:
            with os.scandir(path) as entries:
                pending.extend(
                    entry.path for entry in entries if entry.is_dir(follow_symlinks=False)
                )
        except OSError:
            pass


def _owner_bits(path: bytes) -> None:
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode) and mode & 0o700 != 0o700:
            # Not through a link, should one replace the folder since lstat: Linux then
            # refuses (NotImplementedError) rather than change the link's target.
            os.chmod(path, stat.S_IMODE(mode) | 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
