"""Bounds the server keeps for the whole turn, not per call (stdlib only, Python 3.8+).

``bound_inodes`` caps how many entries the workspace tmpfs holds. nsjail and
Docker mount it with ``nr_inodes`` already; bubblewrap has no option for it, so
the server, which holds ``CAP_SYS_ADMIN`` over the sandbox's mount namespace,
remounts the tmpfs with the bound before any call runs. Without it, empty
files cost nothing of the ``size`` bound while each pins about 1.4 KiB of host
kernel memory (inode and dentry).
"""

from __future__ import annotations

import ctypes
import os

from . import _launch

__all__ = ["bound_inodes"]

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits -> the mount flags that keep them: a remount resets every per-mount
# flag it is not given (losing nosuid would be worse than no inode bound), and in a user
# namespace the kernel refuses to clear a flag it locked.
_KEEP = (
    (os.ST_RDONLY, _MS_RDONLY),
    (os.ST_NOSUID, _MS_NOSUID),
    (os.ST_NODEV, _MS_NODEV),
    (os.ST_NOEXEC, _MS_NOEXEC),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
    (os.ST_RELATIME, _MS_RELATIME),
)


def bound_inodes(path: str, inodes: int) -> str:
    """Hold the tmpfs at ``path`` to at most ``inodes`` entries; return why not, or ``""``."""
    try:
        before = os.statvfs(path)
        if 0 < before.f_files <= inodes:
            return ""  # the backend mounted it bounded (nsjail, Docker)
        flags = _MS_REMOUNT
        for st_flag, ms_flag in _KEEP:
            if before.f_flag & st_flag:
                flags |= ms_flag
        data = f"nr_inodes={inodes}".encode()
        result = _launch._lib().mount(
            None, path.encode(), None, ctypes.c_ulong(flags), ctypes.c_char_p(data)
        )
        if result != 0:
            err = ctypes.get_errno()
            return f"cannot remount {path} with nr_inodes={inodes}: {os.strerror(err)}"
        after = os.statvfs(path)
    except OSError as exc:
        return f"cannot bound the inodes of {path}: {exc}"
    lost = before.f_flag & ~after.f_flag & (os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV)
    if lost or not 0 < after.f_files <= inodes:
        return (
            f"remounting {path} left {after.f_files} inodes (wanted {inodes}), "
            f"flags {after.f_flag:#x} of {before.f_flag:#x}"
        )
    return ""
