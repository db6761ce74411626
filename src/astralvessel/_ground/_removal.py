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

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=failed)
    else:  # onerror, deprecated from 3.12, gives the exception as a tuple
        shutil.rmtree(folder, onerror=lambda fn, path, info: failed(fn, path, info[1]))
    return problems


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
