"""The shipped deny lists: what confined calls, the sandbox server and its helpers may not do.

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
- ``CALLS_TOOL_SERVERS`` and ``CALLS_AS_ROOT_TOOL_SERVERS``: the two above under
  ``Policy.tool_servers``.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

from ._abi import (
    AF_NETLINK,
    AF_UNIX,
    CALL_SOCKET_FAMILIES,
    F_NOTIFY,
    F_SETLEASE,
    NAMESPACE_FLAGS,
    NETLINK_AUDIT,
    NETLINK_ROUTE,
    NETLINK_SOCK_DIAG,
    O_CREAT,
    O_TMPFILE_BIT,
    PER_LINUX,
    PERSONALITY_QUERY,
    S_ISGID,
    S_ISUID,
    SERVER_SOCKET_FAMILIES,
    TIOCLINUX,
    TIOCSTI,
)
from ._rules import AllOf, ArgEquals, ArgHasBits, ArgNotIn, DenyList, Rule


def _always(syscall: str, why: str, err: int = errno.EPERM) -> Rule:
    return Rule(syscall=syscall, why=why, errno=err)


def _group(names: str, why: str, err: int = errno.EPERM) -> tuple[Rule, ...]:
    return tuple(_always(name, why, err) for name in names.split())


def _command(syscall: str, command: int, why: str) -> Rule:
    """Refuse ``syscall`` (``ioctl``, ``fcntl``) for one command, its second argument."""
    return Rule(syscall=syscall, when=ArgEquals(index=1, name="cmd", value=command), why=why)


def _families_only(syscall: str, families: tuple[int, ...], why: str) -> Rule:
    """Refuse ``syscall`` (``socket``, ``socketpair``) in any domain but ``families``."""
    return Rule(syscall=syscall, when=ArgNotIn(index=0, name="domain", values=families), why=why)


def _netlink_only(protocols: tuple[int, ...], why: str) -> Rule:
    """Refuse a netlink socket of any protocol but ``protocols``."""
    return Rule(
        syscall="socket",
        when=AllOf(
            conditions=(
                ArgEquals(index=0, name="domain", value=AF_NETLINK),
                ArgNotIn(index=2, name="protocol", values=protocols),
            )
        ),
        why=why,
    )


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
# An anonymous unix pair has no name and reaches nothing outside the call, and
# asyncio's self-pipe, curl's resolver thread and libuv's child stdio need one.
_UNIX_PAIRS_ONLY = _families_only(
    "socketpair", (AF_UNIX,), "socket pairs are unix ones: nameless, connected only to each other"
)
_NETLINK_ROUTE_ONLY = _netlink_only(
    (NETLINK_ROUTE,),
    "netlink protocols but route reach the host's audit, uevents and other subsystems",
)
#: ``_NETLINK_ROUTE_ONLY`` for the server, whose memory watch also reads sock_diag.
_NETLINK_ROUTE_AND_DIAG = _netlink_only(
    (NETLINK_ROUTE, NETLINK_SOCK_DIAG),
    (
        "netlink protocols but route and sock_diag (the memory watch's count of the "
        "sandbox's socket buffers) reach the host's audit, uevents and other subsystems"
    ),
)


_IPC_WHY = "SysV/POSIX IPC would let a call talk to processes outside its own tree"
_PTRACE_WHY = "reads or controls another process's memory or descriptors"
_MOUNT_WHY = "changes the filesystem view the sandbox was built with"
_KEYS_WHY = "the kernel keyring is not namespaced and has a long history of bugs"
_KERNEL_WHY = "changes the running kernel or system-wide state"

_CALL_FAMILIES = _families_only(
    "socket",
    CALL_SOCKET_FAMILIES,
    (
        "only IP (the sandbox's own loopback) and netlink; unix sockets reach services "
        "by path or name, vsock reaches the hypervisor past the network namespace"
    ),
)
#: ``_CALL_FAMILIES`` under ``Policy.tool_servers``: unix sockets too.
_TOOL_SERVER_FAMILIES = _families_only(
    "socket",
    SERVER_SOCKET_FAMILIES,
    (
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
    _command("fcntl", F_NOTIFY, "dnotify reports accesses in a directory, as inotify does"),
    _command(
        "fcntl",
        F_SETLEASE,
        "a lease on a file in a writable mount stalls the host's own opens of it",
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
    _command("ioctl", TIOCSTI, "TIOCSTI pushes keystrokes into a terminal the caller shares"),
    _command("ioctl", TIOCLINUX, "TIOCLINUX can paste a console selection as input, like TIOCSTI"),
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
        _families_only(
            "socket",
            SERVER_SOCKET_FAMILIES,
            "the server uses unix socket pairs; other families as for calls",
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
    _families_only(
        "socket", (AF_UNIX,), "the relay opens only unix sockets, to the host's egress proxy"
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
