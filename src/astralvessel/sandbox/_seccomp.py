"""The seccomp deny list: one source of truth, compiled into every form a backend needs.

A ``DenyList`` is a named tuple of ``Rule`` values, each naming one system call,
an optional argument condition and the errno the caller sees. These lists ship:

- ``CALLS``: applied to every confined call (declared tools, grep, bash) between
  fork and exec by the sandbox server.
- ``SERVER``: the subset the sandbox server itself never needs, for the outer
  sandbox around it (it still may create namespaces, mount, set process groups):
  ``CALLS`` less ``SERVER_ALLOWANCES``.
- ``FILE_WORKER`` and ``RELAY`` (``HELPERS``): what the server's helpers that read
  model-controlled data stack over ``SERVER``: every allowance they do not need
  taken back, and no process started.
- ``CALLS_AS_ROOT``: ``CALLS`` for a turn with ``Policy.root_identity``, where the
  chown family succeeds without running (errno 0): a root with one id mapped
  and no capability cannot give a file away, and package managers and
  ``adduser`` stop at the first refused chown (what ``fakeroot`` does, without
  remembering the owner it was told).

From one list this module builds, as pure functions:

- ``compile_bpf``: a raw classic-BPF program (``struct sock_filter[]``), what
  ``prctl(PR_SET_SECCOMP)`` and bubblewrap's ``--seccomp FD`` take;
- ``to_kafel``: nsjail's ``--seccomp_string`` policy text;
- ``to_docker_profile``: Docker's JSON seccomp profile.

Every form checks the architecture first (a foreign ABI such as i386 or x32 kills
the process) and compares 32-bit arguments on their low word only, because the
kernel truncates them (a filter comparing all 64 bits can be bypassed by setting
the high word, as ``ioctl(TIOCSTI | 1 << 32)`` did against several sandboxes).

This module is longer than most on purpose: the list, its reference
semantics and its three compilers must change together (a new condition type
is a rule, a ``decide`` case and one emitter per form), and the tests hold
all four against each other.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal, TypeAlias

import attrs

__all__ = [
    "CALLS",
    "CALLS_AS_ROOT",
    "CALLS_AS_ROOT_TOOL_SERVERS",
    "CALLS_TOOL_SERVERS",
    "FILE_WORKER",
    "HELPERS",
    "PROFILES",
    "RELAY",
    "SERVER",
    "SERVER_ALLOWANCES",
    "AllOf",
    "Arch",
    "ArgEquals",
    "ArgHasBits",
    "ArgNotIn",
    "Condition",
    "DenyList",
    "Rule",
    "available_arch",
    "calls_list",
    "compile_bpf",
    "compiled",
    "helper_programs",
    "syscall_number",
    "to_docker_profile",
    "to_kafel",
    "x32_guard",
]

#: The architectures a filter can be compiled for (both little-endian, 64-bit).
Arch: TypeAlias = Literal["x86_64", "aarch64"]
ARCHES: tuple[Arch, ...] = ("x86_64", "aarch64")

# <linux/audit.h>: EM_X86_64 / EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
AUDIT_ARCH: Mapping[Arch, int] = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
AUDIT_ARCH_I386 = 0x40000003
# x32 shares AUDIT_ARCH_X86_64 and is told apart only by this bit in the call number.
X32_SYSCALL_BIT = 0x40000000
# The x32 numbers the kafel form refuses explicitly (kafel has no x32 check; the
# kernel's x32 table currently ends near 550, so 1024 leaves room to grow).
_X32_SPAN = 1024

# <linux/seccomp.h> return actions.
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
# Classic BPF opcodes (<linux/filter.h>) and the kernel's program length limit.
BPF_LD_W_ABS = 0x20
BPF_JMP_JA = 0x05
BPF_JMP_JEQ_K = 0x15
BPF_JMP_JGE_K = 0x35
BPF_JMP_JSET_K = 0x45
BPF_RET_K = 0x06
BPF_MAXINSNS = 4096

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
_OFFSET_NR = 0
_OFFSET_ARCH = 4
_MASK32 = 0xFFFFFFFF

# Values compared in arguments (identical on x86_64 and aarch64).
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
NETLINK_ROUTE = 0
NETLINK_AUDIT = 9
NETLINK_SOCK_DIAG = 4
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
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
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


def _check_index(_inst: object, _attr: object, value: int) -> None:
    if not 0 <= value <= 5:
        raise ValueError(f"argument index must be 0..5, not {value}")


def _check_width(_inst: object, _attr: object, value: int) -> None:
    if value not in (32, 64):
        raise ValueError(f"argument width must be 32 or 64, not {value}")


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class ArgEquals:
    """Matches when argument ``index`` equals ``value``.

    ``width`` is the argument's C type: 32 for ``int``/``unsigned int`` (the
    kernel ignores the high word, so only the low word is compared), 64 for
    ``long``/pointers (both words compared).
    """

    index: int = attrs.field(validator=_check_index)
    name: str
    value: int
    width: int = attrs.field(default=32, validator=_check_width)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.value < 1 << self.width:
            raise ValueError(f"{self.name} == {self.value:#x} does not fit {self.width} bits")


@attrs.frozen(kw_only=True)
class ArgHasBits:
    """Matches when argument ``index`` has any bit of ``mask`` set."""

    index: int = attrs.field(validator=_check_index)
    name: str
    mask: int
    width: int = attrs.field(default=32, validator=_check_width)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.mask < 1 << self.width:
            raise ValueError(
                f"mask {self.mask:#x} of {self.name} must be non-zero and fit {self.width} bits"
            )


@attrs.frozen(kw_only=True)
class ArgNotIn:
    """Matches when argument ``index`` is none of ``values`` (an allow-list of values)."""

    index: int = attrs.field(validator=_check_index)
    name: str
    values: tuple[int, ...] = attrs.field(converter=_int_tuple)
    width: int = attrs.field(default=32, validator=_check_width)

    def __attrs_post_init__(self) -> None:
        if not self.values or any(not 0 <= v < 1 << self.width for v in self.values):
            raise ValueError(f"values of {self.name} must be non-empty and fit {self.width} bits")


ArgCondition: TypeAlias = ArgEquals | ArgHasBits | ArgNotIn


def _arg_tuple(conditions: Iterable[ArgCondition]) -> tuple[ArgCondition, ...]:
    return tuple(conditions)


@attrs.frozen(kw_only=True)
class AllOf:
    """Matches when every one of ``conditions`` holds, each on a different argument.

    One argument per condition keeps every form able to express it: libseccomp
    (Docker) takes at most one comparison per argument in a rule.
    """

    conditions: tuple[ArgCondition, ...] = attrs.field(converter=_arg_tuple)

    def __attrs_post_init__(self) -> None:
        indexes = [c.index for c in self.conditions]
        if len(indexes) < 2 or len(set(indexes)) != len(indexes):
            raise ValueError(
                f"AllOf needs two or more conditions on distinct arguments, not {indexes}"
            )
        if not all(isinstance(c, ArgEquals | ArgHasBits | ArgNotIn) for c in self.conditions):
            raise ValueError("AllOf holds argument conditions only")


Condition: TypeAlias = ArgCondition | AllOf


def _arg_matches(cond: ArgCondition, raw: int) -> bool:
    """Whether ``cond`` holds for a raw 64-bit argument, as the kernel would see it."""
    value = raw & _MASK32 if cond.width == 32 else raw
    if isinstance(cond, ArgEquals):
        return value == cond.value
    if isinstance(cond, ArgHasBits):
        return value & cond.mask != 0
    return value not in cond.values


def _parts(cond: Condition) -> tuple[ArgCondition, ...]:
    return cond.conditions if isinstance(cond, AllOf) else (cond,)


def _condition_matches(cond: Condition, args: Sequence[int]) -> bool:
    """Whether ``cond`` holds for a call's six raw arguments."""
    return all(_arg_matches(part, args[part.index]) for part in _parts(cond))


@attrs.frozen(kw_only=True)
class Rule:
    """One refused system call: refused always, or only when ``when`` holds.

    ``errno`` is what the caller sees; 0 answers success without running the
    call (``CALLS_AS_ROOT``'s chowns).
    """

    syscall: str
    why: str
    when: Condition | None = None
    errno: int = errno.EPERM

    def __attrs_post_init__(self) -> None:
        if not any(self.syscall in table for table in _TABLES.values()):
            raise ValueError(f"unknown system call {self.syscall!r}: add its numbers to the tables")
        if not 0 <= self.errno < 4096:
            raise ValueError(f"errno for {self.syscall} must be 0..4095, not {self.errno}")

    def matches(self, args: Sequence[int]) -> bool:
        """Whether a call with these six raw arguments is refused by this rule."""
        return self.when is None or _condition_matches(self.when, args)


def _rule_tuple(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    return tuple(rules)


@attrs.frozen(kw_only=True)
class DenyList:
    """A named, ordered set of refused system calls; everything else is allowed."""

    name: str
    rules: tuple[Rule, ...] = attrs.field(converter=_rule_tuple)

    def __attrs_post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"deny list name {self.name!r} must be an identifier")
        unconditional = [r.syscall for r in self.rules if r.when is None]
        duplicates = sorted({s for s in unconditional if unconditional.count(s) > 1})
        mixed = sorted({r.syscall for r in self.rules if r.when is not None} & set(unconditional))
        if duplicates or mixed:
            raise ValueError(f"deny list {self.name!r} lists {duplicates + mixed} more than once")

    @property
    def syscalls(self) -> tuple[str, ...]:
        """The names of every system call with a rule, in order, each once."""
        return tuple(dict.fromkeys(r.syscall for r in self.rules))

    def without(self, *syscalls: str, name: str) -> DenyList:
        """A copy named ``name`` that no longer refuses ``syscalls`` (all their rules)."""
        unknown = set(syscalls) - set(self.syscalls)
        if unknown:
            raise ValueError(f"deny list {self.name!r} has no rules for {sorted(unknown)}")
        return DenyList(name=name, rules=tuple(r for r in self.rules if r.syscall not in syscalls))

    def unconditional(self, *, name: str) -> DenyList:
        """A copy named ``name`` with only the rules that refuse a call whatever its arguments.

        Docker's server containers take it as the engine's profile: libseccomp, which runc
        uses, spends milliseconds on each argument condition at every container's start.
        """
        return DenyList(name=name, rules=tuple(r for r in self.rules if r.when is None))

    def rules_for(self, arch: Arch) -> tuple[Rule, ...]:
        """The rules whose system call exists on ``arch``."""
        return tuple(r for r in self.rules if r.syscall in _TABLES[arch])

    def decide(self, syscall: str, args: Sequence[int] = (0,) * 6) -> int | None:
        """The errno a call gets under this list, or None if allowed: the reference semantics."""
        padded = (*args, *(0,) * (6 - len(args)))
        for rule in self.rules:
            if rule.syscall == syscall and rule.matches(padded):
                return rule.errno
        return None


def _always(syscall: str, why: str, err: int = errno.EPERM) -> Rule:
    return Rule(syscall=syscall, why=why, errno=err)


def _group(names: str, why: str, err: int = errno.EPERM) -> tuple[Rule, ...]:
    return tuple(_always(name, why, err) for name in names.split())


def _setid_mode(syscall: str, index: int) -> Rule:
    return Rule(
        syscall=syscall,
        when=ArgHasBits(index=index, name="mode", mask=S_ISUID | S_ISGID),
        why=_SETID_WHY,
    )


def _setid_create(syscall: str, flags: int) -> Rule:
    return Rule(
        syscall=syscall,
        when=AllOf(
            conditions=(
                ArgHasBits(index=flags, name="flags", mask=O_CREAT | O_TMPFILE_BIT),
                ArgHasBits(index=flags + 1, name="mode", mask=S_ISUID | S_ISGID),
            )
        ),
        why=_SETID_WHY,
    )


_SETID_WHY = (
    "a set-id file left in a writable mount would run as the call's user for anyone on the host"
)
#: Every way to give a file a mode names the mode in a register, except openat2.
_SETID_RULES: tuple[Rule, ...] = (
    *(_setid_mode(name, 1) for name in ("chmod", "fchmod", "creat", "mknod")),
    *(_setid_mode(name, 2) for name in ("fchmodat", "fchmodat2", "mknodat")),
    _setid_create("open", 1),
    _setid_create("openat", 2),
    _always(
        "openat2",
        "its mode sits in memory a filter cannot read; ENOSYS makes libc fall back to openat",
        errno.ENOSYS,
    ),
)
_UNIX_PAIRS_ONLY = Rule(
    syscall="socketpair",
    when=ArgNotIn(index=0, name="domain", values=(AF_UNIX,)),
    # An anonymous unix pair has no name and reaches nothing outside the call, and
    # asyncio's self-pipe, curl's resolver thread and libuv's child stdio need one.
    why="socket pairs are unix ones: nameless, connected only to each other",
)
_NETLINK_ROUTE_ONLY = Rule(
    syscall="socket",
    when=AllOf(
        conditions=(
            ArgEquals(index=0, name="domain", value=AF_NETLINK),
            ArgNotIn(index=2, name="protocol", values=(NETLINK_ROUTE,)),
        )
    ),
    why="netlink protocols but route reach the host's audit, uevents and other subsystems",
)
#: ``_NETLINK_ROUTE_ONLY`` for the server, whose memory watch also reads sock_diag.
_NETLINK_ROUTE_AND_DIAG = Rule(
    syscall="socket",
    when=AllOf(
        conditions=(
            ArgEquals(index=0, name="domain", value=AF_NETLINK),
            ArgNotIn(index=2, name="protocol", values=(NETLINK_ROUTE, NETLINK_SOCK_DIAG)),
        )
    ),
    why=(
        "netlink protocols but route and sock_diag (the memory watch's count of the "
        "sandbox's socket buffers) reach the host's audit, uevents and other subsystems"
    ),
)


_IPC_WHY = "SysV/POSIX IPC would let a call talk to processes outside its own tree"
_PTRACE_WHY = "reads or controls another process's memory or descriptors"
_MOUNT_WHY = "changes the filesystem view the sandbox was built with"
_KEYS_WHY = "the kernel keyring is not namespaced and has a long history of bugs"
_KERNEL_WHY = "changes the running kernel or system-wide state"

_CALL_FAMILIES = Rule(
    syscall="socket",
    when=ArgNotIn(index=0, name="domain", values=CALL_SOCKET_FAMILIES),
    why=(
        "only IP (the sandbox's own loopback) and netlink; unix sockets reach services "
        "by path or name, vsock reaches the hypervisor past the network namespace"
    ),
)
#: ``_CALL_FAMILIES`` under ``Policy.tool_servers``: unix sockets too.
_TOOL_SERVER_FAMILIES = Rule(
    syscall="socket",
    when=ArgNotIn(index=0, name="domain", values=SERVER_SOCKET_FAMILIES),
    why=(
        "tool_servers: unix sockets within the turn, IP on its loopback and netlink; vsock "
        "reaches the hypervisor past the network namespace"
    ),
)

_CALLS_RULES: tuple[Rule, ...] = (
    _always("setsid", "a new session would escape the call's process group and outlive it"),
    _always("setpgid", "a new process group would escape the kill at the end of the call"),
    _CALL_FAMILIES,
    _NETLINK_ROUTE_ONLY,
    _UNIX_PAIRS_ONLY,
    *_SETID_RULES,
    *_group(
        "inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark",
        "watches on bound host folders would show what the host runs and opens; "
        "ENOSYS, as on a kernel without them, makes tools fall back to polling",
        errno.ENOSYS,
    ),
    Rule(
        syscall="fcntl",
        when=ArgEquals(index=1, name="cmd", value=F_NOTIFY),
        why="dnotify reports accesses in a directory, as inotify does",
    ),
    Rule(
        syscall="fcntl",
        when=ArgEquals(index=1, name="cmd", value=F_SETLEASE),
        why="a lease on a file in a writable mount stalls the host's own opens of it",
    ),
    *_group("shmget shmat shmctl shmdt msgget msgsnd msgrcv msgctl", _IPC_WHY),
    *_group("semget semop semtimedop semctl", _IPC_WHY),
    *_group("mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr", _IPC_WHY),
    *_group("ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd", _PTRACE_WHY),
    *_group("mount umount2 move_mount fsopen fsmount fsconfig fspick", _MOUNT_WHY),
    *_group("open_tree open_tree_attr mount_setattr pivot_root chroot", _MOUNT_WHY),
    _always("unshare", "new namespaces are the usual first step of kernel exploits"),
    Rule(
        syscall="clone",
        when=ArgHasBits(index=0, name="flags", mask=NAMESPACE_FLAGS),
        why="clone may not create namespaces; plain fork and threads stay allowed",
    ),
    _always(
        "clone3",
        "its flags sit in memory a filter cannot read; ENOSYS makes libc fall back to clone",
        errno.ENOSYS,
    ),
    _always("setns", "joining another namespace would leave the sandbox's"),
    *_group("keyctl add_key request_key", _KEYS_WHY),
    _always("bpf", "eBPF programs are kernel attack surface and can observe the host"),
    _always("perf_event_open", "performance counters leak information and are attack surface"),
    _always("userfaultfd", "lets an exploit pause the kernel mid-copy to win races"),
    *_group(
        "io_uring_setup io_uring_enter io_uring_register",
        "io_uring performs system calls the filter never sees",
    ),
    *_group("kexec_load kexec_file_load", "loads a new kernel"),
    *_group("init_module finit_module delete_module", "loads or unloads kernel modules"),
    Rule(
        syscall="ioctl",
        when=ArgEquals(index=1, name="cmd", value=TIOCSTI),
        why="TIOCSTI pushes keystrokes into a terminal the caller shares",
    ),
    Rule(
        syscall="ioctl",
        when=ArgEquals(index=1, name="cmd", value=TIOCLINUX),
        why="TIOCLINUX can paste a console selection as input, like TIOCSTI",
    ),
    _always("reboot", _KERNEL_WHY),
    *_group("swapon swapoff", _KERNEL_WHY),
    _always("acct", _KERNEL_WHY),
    *_group("settimeofday clock_settime", "sets the system clock"),
    *_group(
        "open_by_handle_at name_to_handle_at",
        "file handles open files outside the mounts (the 'shocker' container escape)",
    ),
    Rule(
        syscall="personality",
        when=ArgNotIn(index=0, name="persona", values=(PER_LINUX, PERSONALITY_QUERY)),
        why="other personalities turn off address randomisation or change the ABI",
    ),
    _always("vhangup", "hangs up the terminal other processes share"),
    *_group("quotactl quotactl_fd", _KERNEL_WHY),
    _always("lookup_dcookie", "a profiling interface that exposes kernel path lookups"),
    _always("syslog", "reads or controls the kernel log"),
    *_group("iopl ioperm", "grants direct hardware I/O port access (x86 only)"),
)

#: Refused in every confined call.
CALLS = DenyList(name="calls", rules=_CALLS_RULES)

_NAMESPACES_WHY = "the zygote and each call's init make the call's namespaces"
_MOUNTS_WHY = "each call's init mounts its own /proc (and /dev, for tool_servers' terminals)"
#: What the sandbox server may do that a call may not, each with why: ``SERVER`` is
#: ``CALLS`` less these. Every helper the server forks that reads model-controlled data
#: takes back, in ``HELPERS``, each of these it does not need itself.
SERVER_ALLOWANCES: Mapping[str, str] = {
    "pidfd_getfd": (
        "the memory watch copies in the descriptors of a call's process that made itself "
        "not dumpable (each call installs CALLS over this, so no call has it)"
    ),
    "setsid": "each call's init leads a session of its own",
    "setpgid": "a call started without namespaces leads a process group of its own",
    "socket": (
        "unix sockets too: the egress relay connects to the host's proxy through one "
        "(every other family a call may not use stays refused, below)"
    ),
    "socketpair": "unix pairs, as for calls: the zygote's order and id-mapping sockets",
    "unshare": _NAMESPACES_WHY,
    "clone": _NAMESPACES_WHY,
    "clone3": "libc's fork tries it first; refused with ENOSYS it falls back to clone",
    "setns": "the zygote returns to its own PID namespace after each call's fork",
    **dict.fromkeys(
        (
            "mount",
            "umount2",
            "move_mount",
            "fsopen",
            "fsmount",
            "fsconfig",
            "fspick",
            "open_tree",
            "open_tree_attr",
            "mount_setattr",
            "pivot_root",
            "chroot",
        ),
        _MOUNTS_WHY,
    ),
}

#: Refused in the sandbox server: ``CALLS`` less ``SERVER_ALLOWANCES``. Unix sockets
#: stay allowed; every family a call may not use but unix is refused here too, so
#: Docker's container profile (which replaces Docker's default one) refuses vsock and
#: the rest as well.
_SERVER_BASE = CALLS.without(*SERVER_ALLOWANCES, name="server")
SERVER = DenyList(
    name="server",
    rules=(
        *_SERVER_BASE.rules,
        Rule(
            syscall="socket",
            when=ArgNotIn(index=0, name="domain", values=SERVER_SOCKET_FAMILIES),
            why="the server uses unix socket pairs; other families as for calls",
        ),
        _NETLINK_ROUTE_AND_DIAG,
        _UNIX_PAIRS_ONLY,
    ),
)

_NO_PROCESS_WHY = (
    "a helper starts no process and runs no program: taken over, it could not start a shell"
)


def _helper_list(name: str, sockets: Rule) -> DenyList:
    """A helper's list, stacked over ``SERVER``: every server allowance taken back (as
    ``CALLS`` refuses it), ``sockets`` for sockets, and no process started.

    A filter stacked on the server's needs to name only what that one allows: the
    kernel applies both, and the stricter answer wins.
    """
    shared = ("socket", "socketpair", "clone")
    taken_back = tuple(
        rule
        for rule in CALLS.rules
        if rule.syscall in SERVER_ALLOWANCES and rule.syscall not in shared
    )
    return DenyList(
        name=name,
        rules=(
            *taken_back,
            sockets,
            _always("socketpair", "a helper talks over the pipes or sockets it was forked with"),
            *_group("clone fork vfork execve execveat", _NO_PROCESS_WHY),
        ),
    )


#: Stacked over ``SERVER`` in the file worker, which opens, reads and writes the paths a
#: model names: it keeps none of the server's allowances and opens no socket at all.
FILE_WORKER = _helper_list(
    "file_worker",
    _always("socket", "the file worker answers on the two pipes it was forked with"),
)
#: Stacked over ``SERVER`` in the egress relay, which copies bytes a call sends: it keeps
#: unix sockets alone, for its connection to the host's proxy per call connection (its
#: loopback listener is bound before the filter).
RELAY = _helper_list(
    "relay",
    Rule(
        syscall="socket",
        when=ArgNotIn(index=0, name="domain", values=(AF_UNIX,)),
        why="the relay opens only unix sockets, to the host's egress proxy",
    ),
)
#: Each helper's list, by the name the hello gives its program (``helper_programs``).
HELPERS: Mapping[str, DenyList] = {"file_worker": FILE_WORKER, "relay": RELAY}


_NO_OP_CHOWN_WHY = (
    "root_identity: the call's root has one id mapped and no capability, so a chown could "
    "only fail; it succeeds and changes nothing, as fakeroot's does"
)
#: Confined calls of a turn with ``Policy.root_identity``: ``CALLS``, and every chown a
#: no-op that succeeds. No chown can give a file to anyone: the call's namespace maps one
#: id, and outside it the file stays the turn's host identity's.
CALLS_AS_ROOT = DenyList(
    name="calls_as_root",
    rules=(
        # Before CALLS' own netlink rule, which answers EPERM: shadow's useradd and userdel
        # open the audit socket and abort on EPERM, but go on without audit on a kernel
        # that has none, which is what EPROTONOSUPPORT says.
        Rule(
            syscall="socket",
            when=AllOf(
                conditions=(
                    ArgEquals(index=0, name="domain", value=AF_NETLINK),
                    ArgEquals(index=2, name="protocol", value=NETLINK_AUDIT),
                )
            ),
            why="the audit socket reaches the host's audit log; refused as a kernel without it",
            errno=errno.EPROTONOSUPPORT,
        ),
        *CALLS.rules,
        *_group("chown fchown lchown fchownat", _NO_OP_CHOWN_WHY, 0),
    ),
)


def _with_tool_servers(base: DenyList) -> DenyList:
    """``base`` under ``Policy.tool_servers``: new sessions and process groups allowed (a
    call's PID namespace still ends with it), and unix sockets (the turn's filesystem and
    network namespace are its own, so they reach only what its own processes listen on).
    Every other rule stays, vsock and the netlink kinds included."""
    rules = tuple(
        _TOOL_SERVER_FAMILIES if rule is _CALL_FAMILIES else rule
        for rule in base.rules
        if rule.syscall not in ("setsid", "setpgid")
    )
    return DenyList(name=f"{base.name}_tool_servers", rules=rules)


CALLS_TOOL_SERVERS = _with_tool_servers(CALLS)
CALLS_AS_ROOT_TOOL_SERVERS = _with_tool_servers(CALLS_AS_ROOT)

#: The calls' list by ``Policy.root_identity`` and ``Policy.tool_servers``.
_CALL_LISTS: Mapping[tuple[bool, bool], DenyList] = {
    (False, False): CALLS,
    (True, False): CALLS_AS_ROOT,
    (False, True): CALLS_TOOL_SERVERS,
    (True, True): CALLS_AS_ROOT_TOOL_SERVERS,
}


def calls_list(root_identity: bool, tool_servers: bool = False) -> DenyList:
    """The deny list for a turn's confined calls, by its eval relaxations."""
    return _CALL_LISTS[bool(root_identity), bool(tool_servers)]


#: The shipped lists by name.
PROFILES: Mapping[str, DenyList] = {
    CALLS.name: CALLS,
    CALLS_AS_ROOT.name: CALLS_AS_ROOT,
    CALLS_TOOL_SERVERS.name: CALLS_TOOL_SERVERS,
    CALLS_AS_ROOT_TOOL_SERVERS.name: CALLS_AS_ROOT_TOOL_SERVERS,
    SERVER.name: SERVER,
    FILE_WORKER.name: FILE_WORKER,
    RELAY.name: RELAY,
}


def _resolve(deny_list: DenyList | str) -> DenyList:
    if isinstance(deny_list, DenyList):
        return deny_list
    try:
        return PROFILES[deny_list]
    except KeyError:
        raise ValueError(
            f"unknown seccomp profile {deny_list!r}; choose one of {sorted(PROFILES)}"
        ) from None


def _check_arch(arch: str) -> Arch:
    for known in ARCHES:
        if arch == known:
            return known
    raise ValueError(f"cannot build a seccomp filter for {arch!r}; supported: {', '.join(ARCHES)}")


# ---------------------------------------------------------------------------
# Classic BPF: a tiny assembler with labels. Conditional jumps carry 8-bit
# offsets, so a branch whose target is too far is routed through an
# unconditional `ja` (32-bit offset) placed right after the jump.


@attrs.frozen
class _Label:
    id: int


@attrs.frozen
class _Stmt:
    code: int
    k: int


@attrs.frozen
class _Jump:
    code: int
    k: int
    jt: _Label | None  # None: the next instruction
    jf: _Label | None


@attrs.frozen
class _Goto:
    target: _Label


@attrs.frozen
class _Mark:
    label: _Label


_Item: TypeAlias = _Stmt | _Jump | _Goto | _Mark


class _Assembler:
    """Collects instructions with symbolic forward jumps and resolves them to bytes."""

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self._next_label = 0

    def label(self) -> _Label:
        self._next_label += 1
        return _Label(self._next_label)

    def mark(self, label: _Label) -> None:
        self.items.append(_Mark(label))

    def load(self, offset: int) -> None:
        self.items.append(_Stmt(BPF_LD_W_ABS, offset))

    def ret(self, value: int) -> None:
        self.items.append(_Stmt(BPF_RET_K, value))

    def jump(self, code: int, k: int, jt: _Label | None = None, jf: _Label | None = None) -> None:
        self.items.append(_Jump(code, k & _MASK32, jt, jf))

    def goto(self, target: _Label) -> None:
        self.items.append(_Goto(target))

    def assemble(self) -> bytes:
        return b"".join(struct.pack("<HBBI", *insn) for insn in resolve(self.items))


def _layout(
    items: Sequence[_Item], far: set[tuple[int, str]]
) -> tuple[list[int], dict[int, int], int]:
    """Instruction index of every item and label, and the program length, given the far branches."""
    starts: list[int] = []
    labels: dict[int, int] = {}
    pc = 0
    for i, item in enumerate(items):
        starts.append(pc)
        if isinstance(item, _Mark):
            labels[item.label.id] = pc
        elif isinstance(item, _Jump):
            pc += 1 + sum((i, side) in far for side in ("jt", "jf"))
        else:
            pc += 1
    return starts, labels, pc


def _distance(labels: Mapping[int, int], label: _Label | None, fallthrough: int, pc: int) -> int:
    """The forward offset from the instruction at ``pc`` to ``label`` (None: ``fallthrough``)."""
    if label is not None and label.id not in labels:
        raise ValueError(f"BPF label {label.id} is never placed")
    offset = (fallthrough if label is None else labels[label.id]) - pc - 1
    if offset < 0:
        raise ValueError("classic BPF cannot jump backwards")
    return offset


def resolve(items: Sequence[_Item]) -> list[tuple[int, int, int, int]]:
    """Lay out ``items`` as ``(code, jt, jf, k)`` instructions, adding trampolines for far jumps."""
    far: set[tuple[int, str]] = set()  # (item index, "jt" | "jf") routed through a trampoline
    while True:
        starts, labels, end = _layout(items, far)
        grown = False
        out: list[tuple[int, int, int, int]] = []
        for i, item in enumerate(items):
            pc = starts[i]
            if isinstance(item, _Stmt):
                out.append((item.code, 0, 0, item.k))
            elif isinstance(item, _Goto):
                out.append((BPF_JMP_JA, 0, 0, _distance(labels, item.target, end, pc)))
            elif isinstance(item, _Jump):
                tramps = [side for side in ("jt", "jf") if (i, side) in far]
                after = pc + 1 + len(tramps)
                branches = {"jt": item.jt, "jf": item.jf}
                offsets = {}
                for side, label in branches.items():
                    offsets[side] = (
                        tramps.index(side)
                        if side in tramps
                        else _distance(labels, label, after, pc)
                    )
                    if offsets[side] > 0xFF:
                        far.add((i, side))
                        grown = True
                out.append((item.code, offsets["jt"], offsets["jf"], item.k))
                for n, side in enumerate(tramps):
                    ja_pc = pc + 1 + n
                    out.append((BPF_JMP_JA, 0, 0, _distance(labels, branches[side], after, ja_pc)))
        if not grown:
            return out


def _arg_offsets(index: int) -> tuple[int, int]:
    # Both supported architectures are little-endian: the low word comes first.
    low = 16 + 8 * index
    return low, low + 4


def _emit_condition(asm: _Assembler, cond: Condition, match: _Label, miss: _Label) -> None:
    parts = _parts(cond)
    for part in parts[:-1]:
        holds = asm.label()
        _emit_arg(asm, part, holds, miss)
        asm.mark(holds)
    _emit_arg(asm, parts[-1], match, miss)


def _emit_arg(asm: _Assembler, cond: ArgCondition, match: _Label, miss: _Label) -> None:
    low, high = _arg_offsets(cond.index)
    if isinstance(cond, ArgEquals):
        if cond.width == 64:
            asm.load(high)
            asm.jump(BPF_JMP_JEQ_K, cond.value >> 32, None, miss)
        asm.load(low)
        asm.jump(BPF_JMP_JEQ_K, cond.value, match, miss)
    elif isinstance(cond, ArgHasBits):
        if cond.mask >> 32:
            asm.load(high)
            asm.jump(BPF_JMP_JSET_K, cond.mask >> 32, match, None)
        if cond.mask & _MASK32:
            asm.load(low)
            asm.jump(BPF_JMP_JSET_K, cond.mask, match, miss)
        else:
            asm.goto(miss)
    else:
        for value in cond.values:
            next_value = asm.label()
            if cond.width == 64:
                asm.load(high)
                asm.jump(BPF_JMP_JEQ_K, value >> 32, None, next_value)
            asm.load(low)
            asm.jump(BPF_JMP_JEQ_K, value, miss, next_value)
            asm.mark(next_value)
        asm.goto(match)


def _by_syscall(rules: Sequence[Rule], arch: Arch) -> Iterator[tuple[int, list[Rule]]]:
    grouped: dict[str, list[Rule]] = {}
    for rule in rules:
        grouped.setdefault(rule.syscall, []).append(rule)
    table = _TABLES[arch]
    for name in sorted(grouped, key=lambda n: table[n]):
        yield table[name], grouped[name]


def compile_bpf(deny_list: DenyList | str, arch: str) -> bytes:
    """Compile a deny list to a classic-BPF seccomp program for ``arch``.

    The result is an array of ``struct sock_filter`` (8 bytes each, little-endian
    like both supported architectures): what ``prctl(PR_SET_SECCOMP)`` installs
    and what bubblewrap reads from ``--seccomp FD``. It kills the process on any
    other architecture (i386 via ``int 0x80``, AArch32) and on x32 call numbers,
    returns the rule's errno for a refused call and allows everything else.
    """
    profile = _resolve(deny_list)
    target = _check_arch(arch)
    asm = _Assembler()
    kill = asm.label()
    asm.load(_OFFSET_ARCH)
    asm.jump(BPF_JMP_JEQ_K, AUDIT_ARCH[target], None, kill)
    asm.load(_OFFSET_NR)
    if target == "x86_64":
        native = asm.label()
        asm.jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, None, native)
        # -1 is no call at all (tracers use it to skip one); the kernel answers ENOSYS.
        asm.jump(BPF_JMP_JEQ_K, _MASK32, native, kill)
        asm.mark(native)
    for number, rules in _by_syscall(profile.rules_for(target), target):
        next_syscall = asm.label()
        asm.jump(BPF_JMP_JEQ_K, number, None, next_syscall)
        if rules[0].when is None:
            asm.ret(SECCOMP_RET_ERRNO | rules[0].errno)
        else:
            reload = asm.label()
            for i, rule in enumerate(rules):
                assert rule.when is not None  # noqa: S101 -- DenyList forbids mixing
                refuse = asm.label()
                miss = reload if i == len(rules) - 1 else asm.label()
                _emit_condition(asm, rule.when, refuse, miss)
                asm.mark(refuse)
                asm.ret(SECCOMP_RET_ERRNO | rule.errno)
                if miss is not reload:
                    asm.mark(miss)
            # Argument checks overwrote the accumulator: load the call number again.
            asm.mark(reload)
            asm.load(_OFFSET_NR)
        asm.mark(next_syscall)
    asm.ret(SECCOMP_RET_ALLOW)
    asm.mark(kill)
    asm.ret(SECCOMP_RET_KILL_PROCESS)
    program = asm.assemble()
    if len(program) // 8 > BPF_MAXINSNS:
        raise ValueError(
            f"seccomp program for {profile.name!r} exceeds {BPF_MAXINSNS} instructions"
        )
    return program


@functools.cache
def compiled(deny_list: DenyList, arch: str) -> bytes:
    """``compile_bpf`` once per process for each list and architecture: every turn start of
    every backend would assemble the same program again (3-5 ms each).

    Raises ``ValueError`` as ``compile_bpf`` does.
    """
    return compile_bpf(deny_list, arch)


@functools.cache
def helper_programs(arch: str) -> Mapping[str, bytes]:
    """Each of ``HELPERS`` compiled for ``arch``, by helper name (``compiled``).

    Raises ``ValueError`` for an architecture ``compile_bpf`` does not support.
    """
    return {name: compiled(deny_list, arch) for name, deny_list in HELPERS.items()}


# ---------------------------------------------------------------------------
# nsjail's kafel language.


def _kafel_arg(cond: ArgCondition) -> str:
    # Masking with 0xffffffff makes kafel compare the low word only, whatever
    # size its own syscall table gives the argument.
    return f"({cond.name} & 0xffffffff)" if cond.width == 32 else cond.name


def _kafel_expr(cond: Condition) -> str:
    # Kafel separates alternatives with commas; a conjunction needs no parentheses.
    return " && ".join(_kafel_arg_expr(part) for part in _parts(cond))


def _kafel_arg_expr(cond: ArgCondition) -> str:
    arg = _kafel_arg(cond)
    if isinstance(cond, ArgEquals):
        return f"{arg} == {cond.value:#x}"
    if isinstance(cond, ArgHasBits):
        return f"({cond.name} & {cond.mask:#x}) != 0"
    return " && ".join(f"{arg} != {v:#x}" for v in cond.values)


def _kafel_params(conditions: Sequence[Condition]) -> str:
    conds = [part for cond in conditions for part in _parts(cond)]
    names = {c.index: c.name for c in conds}
    if len({(c.index, c.name) for c in conds}) != len(names):
        raise ValueError("conditions on one argument must use one name")
    return ", ".join(names.get(i, f"arg{i}") for i in range(max(names) + 1))


def x32_guard(arch: str) -> bytes | None:
    """A program that kills x32 calls and allows every other: None where there is no x32.

    Stacked on a kafel policy rendered with ``to_kafel(..., x32=False)``, it
    refuses what that policy's x32 block did, in 5 instructions instead of 1024
    entries that nsjail compiles and keeps a quarter of a MiB of heap for, in
    every turn's sandbox.
    """
    if _check_arch(arch) != "x86_64":
        return None
    asm = _Assembler()
    allow, kill = asm.label(), asm.label()
    asm.load(_OFFSET_NR)
    asm.jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, None, allow)
    # -1 is no call at all (tracers use it to skip one), as in compile_bpf.
    asm.jump(BPF_JMP_JEQ_K, _MASK32, allow, kill)
    asm.mark(allow)
    asm.ret(SECCOMP_RET_ALLOW)
    asm.mark(kill)
    asm.ret(SECCOMP_RET_KILL_PROCESS)
    return asm.assemble()


def to_kafel(deny_list: DenyList | str, arch: str, *, x32: bool = True) -> str:
    """Render a deny list as a kafel policy for nsjail's ``--seccomp_string`` on ``arch``.

    Kafel checks the architecture itself (a mismatch kills) but not the x32 bit,
    so on x86_64 the policy also kills every x32 call number explicitly, unless
    ``x32`` is false: only for a process that installs ``x32_guard`` itself.
    """
    profile = _resolve(deny_list)
    target = _check_arch(arch)
    blocks: dict[int, list[str]] = {}
    grouped: dict[tuple[int, str], list[Rule]] = {}
    for rule in profile.rules_for(target):
        grouped.setdefault((rule.errno, rule.syscall), []).append(rule)
    for (err, syscall), rules in grouped.items():
        # By number, named in a comment: kafel's own tables differ between
        # versions (this one spells umount2 differently, older ones lack the
        # newer calls), while our numbers are the ones compile_bpf uses.
        entry = f"SYSCALL[{_TABLES[target][syscall]}] /* {syscall} */"
        conds = [r.when for r in rules if r.when is not None]
        if conds:
            exprs = ", ".join(_kafel_expr(c) for c in conds)
            entry += f" ({_kafel_params(conds)}) {{ {exprs} }}"
        blocks.setdefault(err, []).append(entry)
    name = f"astralvessel_{profile.name}"
    parts: list[str] = []
    if target == "x86_64" and x32:
        numbers = ", ".join(f"SYSCALL[{X32_SYSCALL_BIT + n:#x}]" for n in range(_X32_SPAN))
        parts.append(f"  KILL_PROCESS {{ {numbers} }}")
    for err in sorted(blocks):
        body = ",\n".join(f"    {entry}" for entry in blocks[err])
        parts.append(f"  ERRNO({err}) {{\n{body}\n  }}")
    joined = ",\n".join(parts)
    return f"POLICY {name} {{\n{joined}\n}}\nUSE {name} DEFAULT ALLOW\n"


# ---------------------------------------------------------------------------
# Docker's JSON seccomp profile (libseccomp underneath, via runc).

_DOCKER_ARCH: Mapping[Arch, str] = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def _masked(index: int, mask: int, expected: int) -> dict[str, object]:
    return {"index": index, "value": mask, "valueTwo": expected, "op": "SCMP_CMP_MASKED_EQ"}


def _docker_arg_sets(cond: Condition) -> list[list[dict[str, object]]]:
    """Alternatives (OR) of argument lists (AND); libseccomp takes one comparison per argument."""
    alternatives: list[list[dict[str, object]]] = [[]]
    # A conjunction of per-argument alternatives is every combination of them;
    # AllOf puts each condition on its own argument, so each combination is valid.
    for part in _parts(cond):
        alternatives = [a + b for a in alternatives for b in _docker_arg_alternatives(part)]
    return alternatives


#: The most bits an allow-list's values may span for Docker's form (2**n comparisons).
_DOCKER_SPAN_BITS = 6


def _docker_arg_alternatives(cond: ArgCondition) -> list[list[dict[str, object]]]:
    if isinstance(cond, ArgEquals):
        if cond.width == 64:
            return [[{"index": cond.index, "value": cond.value, "op": "SCMP_CMP_EQ"}]]
        # A mask of 0xffffffff compares the low word only: the kernel ignores the high one.
        return [[_masked(cond.index, _MASK32, cond.value)]]
    if isinstance(cond, ArgHasBits):
        bits = [1 << b for b in range(cond.width) if cond.mask >> b & 1]
        return [[_masked(cond.index, bit, bit)] for bit in bits]
    return _docker_not_in(cond)


def _docker_not_in(cond: ArgNotIn) -> list[list[dict[str, object]]]:
    values = set(cond.values)
    span = 0
    for value in values:
        span |= value
    if span.bit_count() <= _DOCKER_SPAN_BITS:
        # Every allowed value uses only the bits of ``span``: a value with any other
        # bit set is refused by one comparison per such bit, and a value within the
        # span by one exact comparison for each pattern of its bits not allowed.
        outside = [
            [_masked(cond.index, 1 << b, 1 << b)] for b in range(cond.width) if not span >> b & 1
        ]
        inside = [
            [_masked(cond.index, span, pattern)]
            for pattern in _sub_patterns(span)
            if pattern not in values
        ]
        return outside + inside
    if cond.width == 32 and values == {_MASK32}:  # some bit clear
        return [[_masked(cond.index, 1 << b, 0)] for b in range(32)]
    if cond.width == 32 and values == {0, _MASK32}:
        # Neither all zeros nor all ones: somewhere (cyclically) a set bit is
        # followed by a clear one, so these 32 single comparisons cover it exactly.
        return [[_masked(cond.index, 1 << b | 1 << (b + 1) % 32, 1 << b)] for b in range(32)]
    raise ValueError(
        f"Docker's profile format cannot express {cond.name} not in {sorted(values)}; "
        f"use values spanning at most {_DOCKER_SPAN_BITS} bits, or drawn from 0 and 0xffffffff"
    )


def _sub_patterns(span: int) -> list[int]:
    """Every value whose set bits are a subset of ``span``'s."""
    bits = [1 << b for b in range(span.bit_length()) if span >> b & 1]
    return [sum(bit for i, bit in enumerate(bits) if n >> i & 1) for n in range(1 << len(bits))]


def to_docker_profile(deny_list: DenyList | str, arch: str) -> dict[str, object]:
    """Render a deny list as Docker's JSON seccomp profile (``--security-opt seccomp=FILE``).

    Only ``arch`` is listed under ``architectures``: libseccomp then treats
    every other ABI, x32 included, as a bad architecture and kills the caller.
    """
    profile = _resolve(deny_list)
    target = _check_arch(arch)
    entries: list[dict[str, object]] = []
    plain: dict[int, list[str]] = {}
    for rule in profile.rules_for(target):
        if rule.when is None:
            plain.setdefault(rule.errno, []).append(rule.syscall)
            continue
        for args in _docker_arg_sets(rule.when):
            entries.append(
                {
                    "names": [rule.syscall],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": rule.errno,
                    "args": args,
                    "comment": rule.why,
                }
            )
    unconditional = [
        {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": err, "args": []}
        for err, names in sorted(plain.items())
    ]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [_DOCKER_ARCH[target]],
        "syscalls": unconditional + entries,
    }
