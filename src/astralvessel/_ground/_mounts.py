"""The host's own mounts in its snapshot store: a frozen layer staged at a path, and undone.

A frozen layer reaches the host as a detached mount (a descriptor). Held so, it
could serve only this process: the kernel lets a detached mount be cloned again
(``open_tree(OPEN_TREE_CLONE)``, as a fork's server does for its idmapped lower
layer) only in the mount namespace it was cloned in. So the host (root) moves it
onto a folder of its store (``move_mount``) and closes the descriptor: from then
on it is an ordinary path, bound by a fork's launcher as any tree in the store.

On a host whose ``/`` is a shared mount (systemd makes it so) a mount under
the store would propagate to every peer and slave mount namespace (each
sandbox's launcher makes its ``/`` a slave of the host's): a copy per running
sandbox for each layer staged (a fork(100) starts a hundred), and each unmount
again. So there, once per process, the store folder is made a private mount of
its own first (bound onto itself, then ``MS_PRIVATE``): only that bind
propagates, once (and its copies in the namespaces of that moment stay there
until they end: a private mount's unmount does not reach them). Where the
store's mount is not shared (most containers) nothing needs it, and no bind is
made. The store's mount is detached at the host's exit; a host that dies
leaves these mounts: the sweep of its store (``_leftovers``) unmounts what it
finds under a folder before removing it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from typing import Any

__all__ = [
    "detached_clone",
    "make_private",
    "mounts_under",
    "propagates",
    "stage",
    "unmount",
    "unmount_under",
]

_SYS_OPEN_TREE = 428  # the same on every architecture (Linux 5.2 onwards)
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_EMPTY_PATH = 0x1000
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_AT_FDCWD = -100
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_BIND = 0x1000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2

_libc: Any = None


def _lib() -> Any:
    global _libc  # noqa: PLW0603 - one handle for the process, loaded lazily
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def make_private(folder: str) -> None:
    """Make ``folder`` a private mount of its own (bound onto itself, ``MS_PRIVATE``)."""
    path = folder.encode()
    _check(_lib().mount(path, path, None, ctypes.c_ulong(_MS_BIND), None), f"bind {folder}")
    try:
        flags = ctypes.c_ulong(_MS_PRIVATE)
        _check(_lib().mount(None, path, None, flags, None), f"make {folder} private")
    except OSError:
        unmount(folder)
        raise


def propagates(folder: str) -> bool:
    """Whether a mount made under ``folder`` would propagate: the mount it is on is
    shared (``shared:N`` in its ``mountinfo`` line; systemd makes ``/`` so, a container's
    ``/`` is mostly private). False where that cannot be read."""
    base = os.path.realpath(folder)
    best, shared = "", False
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split(" ")
            if len(fields) < 7:
                continue
            point = _unescape(fields[4])
            inside = base == point or base.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                optional = fields[6 : fields.index("-")] if "-" in fields else []
                best, shared = point, any(tag.startswith("shared:") for tag in optional)
    return shared


def stage(fd: int, target: str) -> None:
    """Move the detached mount ``fd`` onto the folder ``target`` (the caller closes ``fd``)."""
    result = _lib().syscall(
        ctypes.c_long(_SYS_MOVE_MOUNT), ctypes.c_int(fd), ctypes.c_char_p(b""),
        ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(target.encode()),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
    )  # fmt: skip
    _check(int(result), f"move the frozen layer onto {target}")


def mount_overlay(target: str, options: str) -> None:
    """Mount a read-only, nosuid, nodev, noexec overlay with ``options`` on ``target``."""
    flags = ctypes.c_ulong(_MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    result = _lib().mount(b"overlay", target.encode(), b"overlay", flags, options.encode())
    _check(int(result), f"mount the stack of layers on {target}")


def detached_clone(folder: str) -> int:
    """A detached clone of the tree at ``folder`` (root: ``open_tree(OPEN_TREE_CLONE)``),
    close-on-exec: a staged layer handed to one sandbox's server, which attaches it in
    its own mount namespace (an adopted warm sandbox's; the caller closes it)."""
    result = _lib().syscall(
        ctypes.c_long(_SYS_OPEN_TREE), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(folder.encode()),
        ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC),
    )  # fmt: skip
    _check(int(result), f"clone the layer at {folder}")
    clone = int(result)
    # Read-only before it leaves the host: a store tree's clone is a bind of the host's
    # own filesystem, writable unless made otherwise (a launcher's bind of it is read-only).
    flags = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", flags, 0, 0, 0), 32)
    done = _lib().syscall(
        ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(clone), ctypes.c_char_p(b""),
        ctypes.c_uint(_AT_EMPTY_PATH), attr, ctypes.c_size_t(32),
    )  # fmt: skip
    try:
        _check(int(done), f"make the clone of {folder} read-only")
    except OSError:
        os.close(clone)
        raise
    return clone


def unmount(target: str) -> bool:
    """Detach the mount at ``target`` (``MNT_DETACH``: its last user frees it); False
    where nothing is mounted there or it cannot be unmounted (not root)."""
    return int(_lib().umount2(target.encode(), ctypes.c_int(_MNT_DETACH))) == 0


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_under(folder: str) -> list[str]:
    """The mount points at or under ``folder`` in this mount namespace, deepest first."""
    base = os.path.realpath(folder)
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split(" ")
            if len(fields) > 4:
                point = _unescape(fields[4])
                if point == base or point.startswith(base + "/"):
                    found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def unmount_under(folder: str) -> int:
    """Detach every mount at or under ``folder`` (a dead host's staged layers, its private
    store), deepest first; how many went. Nothing where there are none (most hosts)."""
    return sum(unmount(point) for point in mounts_under(folder))
