"""Removing a folder the host made, whatever a sandbox left in it.

A snapshot's tree keeps the folder modes a sandbox made (0555 among them), and
a folder may still be busy for a moment (EBUSY: Docker's lazy unmount of a
copy-on-write workspace over it). ``shutil.rmtree`` alone leaves both, as an
ordinary user for good: the snapshot reaper and the sweep of a dead host's
folders remove through this one routine.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

__all__ = ["remove_folder"]

_BUSY_PAUSE = 0.1


def remove_folder(folder: Path, busy_seconds: float = 0.0) -> None:
    """Remove ``folder`` and all under it, folders without write bits too; a busy one is
    tried again for ``busy_seconds``; anything else that fails is left (a sweep finds it)."""
    deadline = time.monotonic() + busy_seconds
    writable = False
    problems: set[int] = set()

    def failed(_function: Any, _path: str, info: Any) -> None:
        problems.add(getattr(info[1], "errno", 0))

    while True:
        problems.clear()
        shutil.rmtree(folder, onerror=failed)
        if not os.path.lexists(folder):
            return
        if not writable and problems & {errno.EACCES, errno.EPERM}:
            # A tree keeps the folder modes a sandbox made (0555 among them): as their owner
            # the host can give itself the bits back, then try once more.
            _make_writable(folder)
            writable = True
            continue
        if errno.EBUSY not in problems or time.monotonic() >= deadline:
            return
        time.sleep(_BUSY_PAUSE)


def _make_writable(folder: Path) -> None:
    def owner_bits(path: str) -> None:
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) and mode & 0o700 != 0o700:
                os.chmod(path, stat.S_IMODE(mode) | 0o700)
        except OSError:
            pass

    owner_bits(str(folder))
    for top, folders, _files in os.walk(folder):
        for name in folders:
            owner_bits(os.path.join(top, name))
