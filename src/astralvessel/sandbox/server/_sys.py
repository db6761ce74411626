"""The system calls Python lacks, through libc and ctypes (stdlib only, Python 3.8+).

Python 3.8 to 3.11 have no ``os.unshare`` or ``os.setns``, and none has ``mount``
or ``prctl``: the server, its zygote, each call's init, the file worker and the
relay reach them here. libc is loaded on first use, and ``_launch.warm`` looks up
every function a call needs before any fork, so no call pays for it.
"""

from __future__ import annotations

import ctypes
import os

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "MNT_DETACH",
    "MS_BIND",
    "MS_NOATIME",
    "MS_NODEV",
    "MS_NODIRATIME",
    "MS_NOEXEC",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_RDONLY",
    "MS_REC",
    "MS_RELATIME",
    "MS_REMOUNT",
    "PR_SET_DUMPABLE",
    "PR_SET_NO_NEW_PRIVS",
    "PR_SET_PDEATHSIG",
    "capget",
    "capset",
    "check",
    "libc",
    "mount",
    "pidfd_getfd",
    "pidfd_open",
    "pipe_load",
    "prctl",
    "setns",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
MNT_DETACH = 2

_libc: Any = None


def libc() -> Any:
    """Return libc through ctypes (loaded on first use: Python 3.8-3.11 lack os.unshare)."""
    global _libc  # noqa: PLW0603 - one handle for the process, loaded lazily
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """Call unshare(2)."""
    check(libc().unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    """Call setns(2)."""
    check(libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """Call mount(2); ``data`` is the filesystem's options (``size=...``, ``lowerdir=...``)."""
    src = None if source is None else source.encode()
    kind = None if fstype is None else fstype.encode()
    result = libc().mount(
        ctypes.c_char_p(src), ctypes.c_char_p(target.encode()), ctypes.c_char_p(kind),
        ctypes.c_ulong(flags), ctypes.c_char_p(data.encode() if data else None),
    )  # fmt: skip
    check(result, f"mount {fstype or 'bind'} on {target}")


def prctl(option: int, value: int) -> None:
    """Call prctl(2) with one argument."""
    zero = ctypes.c_ulong(0)
    result = libc().prctl(ctypes.c_int(option), ctypes.c_ulong(value), zero, zero, zero)
    check(result, f"prctl {option}")


_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# Made once: building a ctypes array type takes longer than the system call.
_CapHeader = ctypes.c_uint32 * 2
_CapData = ctypes.c_uint32 * 6


def capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set this process's three capability sets (64-bit masks)."""
    data = _CapData(
        effective & 0xFFFFFFFF, permitted & 0xFFFFFFFF, inheritable & 0xFFFFFFFF,
        effective >> 32, permitted >> 32, inheritable >> 32,
    )  # fmt: skip
    check(libc().capset(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), data), "capset")


def capget() -> tuple[int, int, int]:
    """This process's effective, permitted and inheritable capability sets (64-bit masks)."""
    data = _CapData()
    check(libc().capget(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), data), "capget")
    return data[0] | data[3] << 32, data[1] | data[4] << 32, data[2] | data[5] << 32


_F_GETPIPE_SZ = 1032
_FIONREAD = 0x541B


def pipe_load(fd: int) -> tuple[int, int]:
    """The pipe ``fd``'s capacity (``F_GETPIPE_SZ``) and the bytes it holds (``FIONREAD``)."""
    held = ctypes.c_int(0)
    capacity = libc().fcntl(ctypes.c_int(fd), ctypes.c_int(_F_GETPIPE_SZ))
    if capacity < 0 or libc().ioctl(
        ctypes.c_int(fd), ctypes.c_ulong(_FIONREAD), ctypes.byref(held)
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"pipe size: {os.strerror(err)}")
    return capacity, held.value


# The same numbers on every architecture the server runs on (x86_64 and aarch64).
_SYS_PIDFD_OPEN = 434
_SYS_PIDFD_GETFD = 438


def pidfd_open(pid: int) -> int:
    """A pidfd of the process ``pid`` (of this PID namespace). Raises ``OSError`` (``ESRCH``
    once it is gone)."""
    fd = int(libc().syscall(ctypes.c_long(_SYS_PIDFD_OPEN), ctypes.c_int(pid), ctypes.c_uint(0)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_open: {os.strerror(err)}")
    return fd


def pidfd_getfd(pidfd: int, number: int) -> int:
    """A copy of descriptor ``number`` of the process ``pidfd`` names, close-on-exec.

    The kernel asks for ptrace access to that process (``PTRACE_MODE_ATTACH``), not
    for read access to its ``/proc/PID/fd``. Raises ``OSError``: ``EBADF`` if it has
    no such descriptor, ``ESRCH`` once it is gone, ``EPERM`` if the caller may not.
    """
    fd = int(
        libc().syscall(
            ctypes.c_long(_SYS_PIDFD_GETFD),
            ctypes.c_int(pidfd),
            ctypes.c_int(number),
            ctypes.c_uint(0),
        )
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_getfd: {os.strerror(err)}")
    return fd
