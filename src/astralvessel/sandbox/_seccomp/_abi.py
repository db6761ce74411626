"""The kernel's numbers the deny lists speak in: architectures, system calls, argument values.

Everything here is a fact of the Linux ABI on the two supported architectures
(both 64-bit and little-endian): the audit architecture a filter checks
first, the x32 bit, the numbers of every system call a list names, and the
argument values (socket families, flags, ioctl and fcntl commands) its
conditions compare.
"""

from __future__ import annotations

import platform
import struct
from collections.abc import Mapping
from typing import Literal, TypeAlias

# The numbers the sandbox server uses too are defined there (it is stdlib-only and
# cannot import from here).
from ..server._kernelmem import NETLINK_SOCK_DIAG
from ..server._sys import CLONE_NEWNS, CLONE_NEWPID
from ..server._userns import CLONE_NEWUSER

__all__ = [
    "AF_INET",
    "AF_INET6",
    "AF_NETLINK",
    "AF_UNIX",
    "ARCHES",
    "AUDIT_ARCH",
    "AUDIT_ARCH_I386",
    "CALL_SOCKET_FAMILIES",
    "CLONE_NEWCGROUP",
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWTIME",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "F_NOTIFY",
    "F_SETLEASE",
    "NAMESPACE_FLAGS",
    "NETLINK_AUDIT",
    "NETLINK_ROUTE",
    "NETLINK_SOCK_DIAG",
    "O_CREAT",
    "O_TMPFILE_BIT",
    "PERSONALITY_QUERY",
    "PER_LINUX",
    "SERVER_SOCKET_FAMILIES",
    "S_ISGID",
    "S_ISUID",
    "TIOCLINUX",
    "TIOCSTI",
    "X32_SYSCALL_BIT",
    "Arch",
    "available_arch",
    "syscall_number",
]

#: The architectures a filter can be compiled for (both little-endian, 64-bit).
Arch: TypeAlias = Literal["x86_64", "aarch64"]
ARCHES: tuple[Arch, ...] = ("x86_64", "aarch64")

# <linux/audit.h>: EM_X86_64 / EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
AUDIT_ARCH: Mapping[Arch, int] = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
AUDIT_ARCH_I386 = 0x40000003
# x32 shares AUDIT_ARCH_X86_64 and is told apart only by this bit in the call number.
X32_SYSCALL_BIT = 0x40000000
# A 32-bit argument is compared on its low word alone: the kernel ignores the high one.
_MASK32 = 0xFFFFFFFF

# Values compared in arguments (identical on x86_64 and aarch64).
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
NETLINK_ROUTE = 0
NETLINK_AUDIT = 9
#: Socket families a confined call may create: IP for the sandbox's own loopback
#: (test servers, local databases) and netlink's route protocol, which getifaddrs,
#: ``if_nameindex`` and ``ip`` use to list the sandbox's interfaces. Every other
#: family (unix, vsock, packet, alg, tipc, rds, bluetooth, ...) reaches past the
#: network namespace or is kernel attack surface no tool here needs.
CALL_SOCKET_FAMILIES = (AF_INET, AF_INET6, AF_NETLINK)
#: The sandbox server also needs unix socketpairs (asyncio's self-pipe).
SERVER_SOCKET_FAMILIES = (AF_UNIX, *CALL_SOCKET_FAMILIES)
# open(2) flags that create a file (identical on both architectures; O_TMPFILE
# is __O_TMPFILE with O_DIRECTORY, and __O_TMPFILE alone is enough to test).
O_CREAT = 0o100
O_TMPFILE_BIT = 0o20000000
# A mode with either set-id bit runs a program as the file's owner or group.
S_ISUID = 0o4000
S_ISGID = 0o2000
# fcntl commands: a lease makes the host's open of the file wait up to 45 s;
# dnotify reports accesses to and changes in a directory, like inotify.
F_SETLEASE = 1024
F_NOTIFY = 1026
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
CLONE_NEWTIME = 0x00000080
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWTIME
)
PER_LINUX = 0
PERSONALITY_QUERY = 0xFFFFFFFF

# System call numbers, only those the lists name. x86_64 from the kernel's
# arch/x86/entry/syscalls/syscall_64.tbl; aarch64 uses the generic table
# (include/uapi/asm-generic/unistd.h), which has no iopl or ioperm.
_X86_64: Mapping[str, int] = {
    "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260,
    "open": 2, "fcntl": 72, "creat": 85, "chmod": 90, "fchmod": 91, "mknod": 133,
    "inotify_init": 253, "inotify_add_watch": 254, "inotify_rm_watch": 255, "openat": 257,
    "mknodat": 259, "fchmodat": 268, "inotify_init1": 294, "fanotify_init": 300,
    "fanotify_mark": 301, "openat2": 437, "fchmodat2": 452,
    "ioctl": 16, "shmget": 29, "shmat": 30, "shmctl": 31, "socket": 41, "socketpair": 53,
    "clone": 56, "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67, "msgget": 68,
    "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "ptrace": 101, "syslog": 103, "setpgid": 109,
    "setsid": 112, "personality": 135, "vhangup": 153, "pivot_root": 155, "chroot": 161,
    "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167,
    "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175,
    "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "semtimedop": 220,
    "clock_settime": 227, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242,
    "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
    "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443, "open_tree_attr": 467,
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
}  # fmt: skip
_AARCH64: Mapping[str, int] = {
    "fchownat": 54, "fchown": 55,
    "fcntl": 25, "inotify_init1": 26, "inotify_add_watch": 27, "inotify_rm_watch": 28,
    "mknodat": 33, "fchmod": 52, "fchmodat": 53, "openat": 56, "fanotify_init": 262,
    "fanotify_mark": 263, "openat2": 437, "fchmodat2": 452,
    "lookup_dcookie": 18, "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41,
    "chroot": 51, "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97,
    "kexec_load": 104, "init_module": 105, "delete_module": 106, "clock_settime": 112,
    "syslog": 116, "ptrace": 117, "reboot": 142, "setpgid": 154, "setsid": 157,
    "settimeofday": 170, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182,
    "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186,
    "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191,
    "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197,
    "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219,
    "clone": 220, "swapon": 224, "swapoff": 225, "perf_event_open": 241,
    "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270,
    "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280, "userfaultfd": 282,
    "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
    "mount_setattr": 442, "quotactl_fd": 443, "open_tree_attr": 467,
    "execve": 221, "execveat": 281,
}  # fmt: skip
_TABLES: Mapping[Arch, Mapping[str, int]] = {"x86_64": _X86_64, "aarch64": _AARCH64}


def syscall_number(name: str, arch: Arch) -> int | None:
    """The number of system call ``name`` on ``arch``, or None where it does not exist."""
    return _TABLES[arch].get(name)


def available_arch() -> Arch | None:
    """The architecture a filter must be compiled for in this process, or None if unsupported."""
    # A 32-bit interpreter on a 64-bit kernel makes i386 calls: no filter here fits it.
    if struct.calcsize("P") != 8:
        return None
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    return None


def _check_arch(arch: str) -> Arch:
    for known in ARCHES:
        if arch == known:
            return known
    raise ValueError(f"cannot build a seccomp filter for {arch!r}; supported: {', '.join(ARCHES)}")
