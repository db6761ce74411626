"""The workspace's tmpfs made by the server itself, its detached original held (stdlib, 3.8+).

A freeze hands the host a detached mount of the workspace's tmpfs, which the
forks' servers lay their overlays on. As root the host stages that mount at a
path of its store and the forks bind it. An ordinary user's host cannot mount,
so the forks get the descriptor itself, and a fork's server, in a user
namespace of its own (a sibling of this one), must clone it once more
(``open_tree(OPEN_TREE_CLONE)``) to own a mount it may lay an overlay on. The
kernel clones a detached mount again only in the mount namespace it was cloned
in, unless ``fsmount`` made it: so here, as an ordinary user, the server
replaces the launcher's workspace tmpfs by one it makes with ``fsopen`` and
``fsmount`` (the same bounds: bytes, inodes, owner, mode and flags), keeps that
first detached mount (close-on-exec, reached by no path: no call can name it)
and attaches a clone of it at the workspace in place of the launcher's (above it
where that cannot be unmounted: it stays below, empty and covered).

It is done at hello, before anything copies the server's view (the file
worker, a call's namespaces, the relay) and before the outbox is made, so
everything sees the new tmpfs alone. A freeze then hands the host the held
mount (``_freeze``): its superblock is the workspace's, frozen with it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from . import _lowerfs, _sys
from ._freeze import TMPFS_MAGIC, _close, _config, _fsopen, filesystem_type
from ._lean import suppress

__all__ = ["hold_workspace"]

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_FSMOUNT = 432
_AT_EMPTY_PATH = 0x1000
_AT_FDCWD = -100
_OPEN_TREE_CLONE = 1
_FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
#: The launcher's mount flags kept on the new tmpfs (statvfs's bit: mount_setattr's).
_KEPT_FLAGS = ((os.ST_NOSUID, 0x2), (os.ST_NODEV, 0x4), (os.ST_NOEXEC, 0x8))


def hold_workspace(workspace: str, size: int, inodes: int) -> int:
    """Cover the tmpfs at ``workspace`` with a new one made by ``fsmount``; return the
    held original (a detached mount, close-on-exec) of which the workspace is a clone.

    ``size`` bytes and ``inodes`` entries bound it, as the launcher's were meant
    to be; its root takes the launcher's owner and mode. Raises ``OSError`` where
    a step is refused (an older kernel), and leaves the workspace as it was;
    ``EOPNOTSUPP`` where the workspace is no tmpfs (Docker's host laid an overlay of a
    snapshot there and bound it in: covering it would hide the snapshot's files).
    """
    if filesystem_type(workspace) != TMPFS_MAGIC:
        raise OSError(errno.EOPNOTSUPP, f"{workspace} is not a tmpfs: it is not made again")
    before = os.stat(workspace)
    attrs = 0
    flags = os.statvfs(workspace).f_flag
    for st_flag, attr in _KEPT_FLAGS:
        if flags & st_flag:
            attrs |= attr
    options = (
        ("size", str(size)),
        ("nr_inodes", str(inodes)),
        ("mode", f"{stat.S_IMODE(before.st_mode):o}"),
        ("uid", str(before.st_uid)),
        ("gid", str(before.st_gid)),
    )
    fs = _fsopen("tmpfs")
    try:
        for key, value in options:
            _config(fs, _FSCONFIG_SET_STRING, key, value, what=f"fsconfig {key}")
        _config(fs, _FSCONFIG_CMD_CREATE, what="create the workspace's tmpfs")
        held = _lowerfs.syscall(
            _SYS_FSMOUNT, "fsmount the workspace's tmpfs", ctypes.c_int(fs),
            ctypes.c_uint(_FSMOUNT_CLOEXEC), ctypes.c_uint(attrs),
        )  # fmt: skip
    finally:
        _close(fs)
    clone = -1
    try:
        clone = _lowerfs.syscall(
            _SYS_OPEN_TREE, "open_tree the workspace's tmpfs", ctypes.c_int(held),
            ctypes.c_char_p(b""),
            ctypes.c_uint(_OPEN_TREE_CLONE | _AT_EMPTY_PATH | os.O_CLOEXEC),
        )  # fmt: skip
        cwd = os.getcwd()
        # The launcher's tmpfs goes where it may (nothing uses it yet), so the workspace is
        # one mount as before; where it may not, it stays below, empty and covered.
        gone = _sys.libc().umount2(workspace.encode(), _sys.MNT_DETACH) == 0
        try:
            _lowerfs.syscall(
                _SYS_MOVE_MOUNT, "move_mount the workspace's tmpfs", ctypes.c_int(clone),
                ctypes.c_char_p(b""), ctypes.c_int(_AT_FDCWD),
                ctypes.c_char_p(workspace.encode()), ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
            )  # fmt: skip
        except OSError:
            if gone:  # a tmpfs as the launcher's again, bounded alike
                flags = _sys.MS_NOSUID if attrs & 0x2 else 0
                flags |= _sys.MS_NODEV if attrs & 0x4 else 0
                _sys.mount(
                    "tmpfs", workspace, "tmpfs", flags, ",".join(f"{k}={v}" for k, v in options)
                )
            raise
    except OSError:
        _close(held)
        raise
    finally:
        _close(clone)
    if cwd == workspace or cwd.startswith(workspace.rstrip("/") + "/"):
        # The path now names the new tmpfs; a working folder held the launcher's.
        with suppress(OSError):
            os.chdir(cwd)
    return held
