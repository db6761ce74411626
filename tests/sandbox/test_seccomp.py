"""The deny list and its compiled forms, checked as values.

The BPF program is run here by a small classic-BPF interpreter over synthetic
``seccomp_data``, which reaches what a live process cannot easily produce: an
i386 or AArch32 caller, every rule on the other architecture, high words set.
"""

from __future__ import annotations

import errno
import functools
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from astralvessel.sandbox import _seccomp as sc
from astralvessel.sandbox._seccomp import (
    CALLS,
    CALLS_AS_ROOT,
    CALLS_AS_ROOT_TOOL_SERVERS,
    CALLS_TOOL_SERVERS,
    FILE_WORKER,
    HELPERS,
    PROFILES,
    RELAY,
    SERVER,
    SERVER_ALLOWANCES,
    ArgEquals,
    ArgHasBits,
    ArgNotIn,
    DenyList,
    Rule,
    available_arch,
    compile_bpf,
    helper_programs,
    syscall_number,
    to_docker_profile,
    to_kafel,
    x32_guard,
)

ARCHES: tuple[sc.Arch, ...] = ("x86_64", "aarch64")
MASK64 = (1 << 64) - 1
ERRNO = sc.SECCOMP_RET_ERRNO
KILL = sc.SECCOMP_RET_KILL_PROCESS
ALLOW = sc.SECCOMP_RET_ALLOW


# --- a classic-BPF interpreter with the kernel's checks ----------------------


def decode(program: bytes) -> list[tuple[int, int, int, int]]:
    """Split a program into ``(code, jt, jf, k)`` instructions."""
    assert len(program) % 8 == 0
    return [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]


@functools.cache
def _decoded(program: bytes) -> tuple[tuple[int, int, int, int], ...]:
    """``decode``'s instructions, split once per program: the edge tests run each thousands of
    times."""
    return tuple(decode(program))


def seccomp_data(nr: int, arch: int, args: Sequence[int] = ()) -> bytes:
    """Pack ``struct seccomp_data`` as a little-endian kernel would."""
    padded = [a & MASK64 for a in (*args, *(0,) * (6 - len(args)))]
    return struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0x400000, *padded)


def run_bpf(program: bytes, data: bytes) -> int:
    """Run a seccomp program on ``data`` and return its verdict, checking every jump."""
    insns = _decoded(program)
    acc = 0
    pc = 0
    while True:
        assert 0 <= pc < len(insns), f"fell off the program at {pc}"
        code, jt, jf, k = insns[pc]
        if code == sc.BPF_LD_W_ABS:
            assert k % 4 == 0, f"unaligned load offset {k}"
            assert k + 4 <= len(data), f"load past seccomp_data at {k}"
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == sc.BPF_RET_K:
            return k
        elif code == sc.BPF_JMP_JA:
            pc += 1 + k
        elif code in (sc.BPF_JMP_JEQ_K, sc.BPF_JMP_JGE_K, sc.BPF_JMP_JSET_K):
            taken = {
                sc.BPF_JMP_JEQ_K: acc == k,
                sc.BPF_JMP_JGE_K: acc >= k,
                sc.BPF_JMP_JSET_K: acc & k != 0,
            }[code]
            pc += 1 + (jt if taken else jf)
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")


def verdict(arch: sc.Arch, name: str, args: Sequence[int] = (), profile: DenyList = CALLS) -> int:
    """The compiled program's answer to a native call of ``name`` on ``arch``."""
    nr = syscall_number(name, arch)
    assert nr is not None
    return run_bpf(_compiled(profile, arch), seccomp_data(nr, sc.AUDIT_ARCH[arch], args))


@functools.cache
def _compiled(profile: DenyList, arch: sc.Arch) -> bytes:
    """``compile_bpf``'s program for a list and architecture, compiled once: it is the same
    bytes each time (``test_compile_is_deterministic``), and the edge tests ask thousands."""
    return compile_bpf(profile, arch)


def expected(profile: DenyList, name: str, args: Sequence[int] = ()) -> int:
    """The verdict the deny list's reference semantics call for."""
    err = profile.decide(name, [a & MASK64 for a in args])
    return ALLOW if err is None else ERRNO | err


# --- the lists ---------------------------------------------------------------


def test_calls_list_names_every_required_syscall() -> None:
    """The calls list refuses everything the design's promises name."""
    required = [
        "setsid",
        "setpgid",
        "socket",
        "socketpair",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "move_mount",
        "fsopen",
        "fsmount",
        "fsconfig",
        "open_tree",
        "pivot_root",
        "chroot",
        "unshare",
        "clone",
        "clone3",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "shmget",
        "shmat",
        "shmctl",
        "shmdt",
        "msgget",
        "msgsnd",
        "msgrcv",
        "msgctl",
        "semget",
        "semop",
        "semtimedop",
        "semctl",
        "mq_open",
        "mq_unlink",
        "mq_timedsend",
        "mq_timedreceive",
        "mq_notify",
        "mq_getsetattr",
        "ioctl",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "settimeofday",
        "clock_settime",
        "open_by_handle_at",
        "name_to_handle_at",
        "personality",
        "vhangup",
        "quotactl",
        "lookup_dcookie",
        "syslog",
        "iopl",
        "ioperm",
    ]
    assert set(required) <= set(CALLS.syscalls)


def test_every_rule_says_why() -> None:
    """Each rule carries a reason, the text the docs and the Docker profile show."""
    assert all(len(rule.why) > 10 for rule in CALLS.rules)


ENOSYS_CALLS = {
    "clone3",
    "openat2",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_init",
    "fanotify_mark",
}


def test_clone3_is_refused_with_enosys() -> None:
    """clone3 and openat2 answer ENOSYS so libc falls back to calls whose arguments a filter reads."""
    assert CALLS.decide("clone3") == errno.ENOSYS
    assert CALLS.decide("openat2") == errno.ENOSYS
    assert {r.syscall for r in CALLS.rules if r.errno == errno.ENOSYS} == ENOSYS_CALLS
    assert {r.errno for r in CALLS.rules if r.syscall not in ENOSYS_CALLS} == {errno.EPERM}


def test_inotify_is_refused_as_if_absent() -> None:
    """inotify and fanotify answer ENOSYS, as on a kernel built without them; dnotify is refused."""
    for name in ("inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init"):
        assert CALLS.decide(name) == errno.ENOSYS
    assert CALLS.decide("fcntl", [3, sc.F_NOTIFY]) == errno.EPERM
    assert CALLS.decide("fcntl", [3, sc.F_SETLEASE]) == errno.EPERM
    assert CALLS.decide("fcntl", [3, 0]) is None  # F_DUPFD
    assert CALLS.decide("fcntl", [3, 6]) is None  # F_SETLK: locks stay allowed


AF_VSOCK, AF_PACKET, AF_ALG, AF_TIPC, AF_RDS = 40, 17, 38, 30, 21


@pytest.mark.parametrize(
    "profile", [CALLS, CALLS_TOOL_SERVERS, SERVER], ids=["calls", "calls_tool_servers", "server"]
)
def test_only_ip_and_netlink_route_sockets(profile: DenyList) -> None:
    """Calls may open IP and netlink-route sockets only; the server, and calls with
    ``tool_servers``, may also open unix ones."""
    for family in (sc.AF_INET, sc.AF_INET6):
        assert profile.decide("socket", [family, 1, 0]) is None
    assert profile.decide("socket", [sc.AF_NETLINK, 3, sc.NETLINK_ROUTE]) is None
    for protocol in (4, 9, 15):  # sock_diag (the server's memory watch), audit, uevents
        refused = None if profile is SERVER and protocol == sc.NETLINK_SOCK_DIAG else errno.EPERM
        assert profile.decide("socket", [sc.AF_NETLINK, 3, protocol]) == refused
    for family in (0, AF_VSOCK, AF_PACKET, AF_ALG, AF_TIPC, AF_RDS, 45, 0xFFFF):
        assert profile.decide("socket", [family, 1, 0]) == errno.EPERM
    unix = profile.decide("socket", [sc.AF_UNIX, 1, 0])
    assert unix == (errno.EPERM if profile is CALLS else None)
    # The kernel reads the low word only: a high word cannot turn vsock into IP.
    assert profile.decide("socket", [(1 << 32) | AF_VSOCK, 1, 0]) == errno.EPERM


@pytest.mark.parametrize(
    "profile", [CALLS, CALLS_TOOL_SERVERS, SERVER], ids=["calls", "calls_tool_servers", "server"]
)
def test_socketpair_only_unix(profile: DenyList) -> None:
    """Socket pairs are nameless unix ones only (asyncio, curl and libuv need them)."""
    assert profile.decide("socketpair", [sc.AF_UNIX, 1, 0, 0]) is None
    assert profile.decide("socketpair", [AF_TIPC, 1, 0, 0]) == errno.EPERM
    assert profile.decide("socketpair", [(1 << 32) | AF_TIPC, 1, 0, 0]) == errno.EPERM


SETID = (0o4755, 0o2755, 0o6755, 0o4000, (1 << 32) | 0o4755)


@pytest.mark.parametrize(
    ("name", "mode_index"),
    [
        ("chmod", 1),
        ("fchmod", 1),
        ("creat", 1),
        ("mknod", 1),
        ("fchmodat", 2),
        ("fchmodat2", 2),
        ("mknodat", 2),
    ],
)
def test_setid_modes_refused(name: str, mode_index: int) -> None:
    """Every call that takes a mode refuses a set-id bit in it and allows plain modes."""
    for mode in SETID:
        args = [0] * 6
        args[mode_index] = mode
        assert CALLS.decide(name, args) == errno.EPERM, (name, oct(mode))
    for mode in (0o755, 0o1777, 0o644, 0o100755):
        args = [0] * 6
        args[mode_index] = mode
        assert CALLS.decide(name, args) is None, (name, oct(mode))


@pytest.mark.parametrize(("name", "flags_index"), [("open", 1), ("openat", 2)])
def test_setid_modes_refused_only_when_creating(name: str, flags_index: int) -> None:
    """open and openat refuse a set-id mode with O_CREAT or O_TMPFILE, and ignore it otherwise."""
    o_rdwr, o_tmpfile = 2, sc.O_TMPFILE_BIT | 0o200000

    def decide(flags: int, mode: int) -> int | None:
        args = [0] * 6
        args[flags_index], args[flags_index + 1] = flags, mode
        return CALLS.decide(name, args)

    assert decide(sc.O_CREAT | o_rdwr, 0o4755) == errno.EPERM
    assert decide(o_tmpfile | o_rdwr, 0o2755) == errno.EPERM
    assert decide(sc.O_CREAT | o_rdwr, 0o755) is None
    assert decide(o_rdwr, 0o4755) is None  # no file is created: the mode is unused
    assert CALLS.decide("openat2") == errno.ENOSYS


def test_all_of_needs_distinct_arguments() -> None:
    """A conjunction puts each condition on its own argument (libseccomp's limit)."""
    one = ArgEquals(index=0, name="domain", value=1)
    with pytest.raises(ValueError, match="distinct arguments"):
        sc.AllOf(conditions=(one, ArgEquals(index=0, name="domain", value=2)))
    with pytest.raises(ValueError, match="two or more"):
        sc.AllOf(conditions=(one,))


def test_server_list_is_a_subset_allowing_namespace_work() -> None:
    """The server list keeps the dangerous calls but allows what launching calls needs."""
    own = {r for r in SERVER.rules if r.syscall in ("socket", "socketpair")}
    assert set(SERVER.rules) - own < set(CALLS.rules)
    for needed in ("unshare", "mount", "setpgid", "setsid", "setns", "clone", "chroot"):
        assert needed not in SERVER.syscalls
    # The memory watch copies in the descriptors of a call's not-dumpable process; calls
    # stack CALLS over the server's filter, which refuses it.
    assert "pidfd_getfd" not in SERVER.syscalls
    assert "pidfd_getfd" in CALLS.syscalls
    for refused in ("ptrace", "kexec_load", "init_module", "bpf", "keyctl", "perf_event_open"):
        assert refused in SERVER.syscalls
    for refused in ("userfaultfd", "io_uring_setup", "reboot", "open_by_handle_at"):
        assert refused in SERVER.syscalls
    assert SERVER.decide("ioctl", [0, sc.TIOCSTI]) == errno.EPERM


def test_server_list_is_calls_less_its_allowances() -> None:
    """SERVER refuses all CALLS refuses but the allowances, each of which says why; of
    sockets it allows unix ones besides what a call may open."""
    assert all(why for why in SERVER_ALLOWANCES.values())
    own = ("socket", "socketpair")
    assert [r for r in SERVER.rules if r.syscall not in own] == [
        r for r in CALLS.rules if r.syscall not in SERVER_ALLOWANCES
    ]
    for name in set(SERVER_ALLOWANCES) - set(own):
        assert CALLS.decide(name, [sc.CLONE_NEWPID]) is not None, name
        assert SERVER.decide(name, [sc.CLONE_NEWPID]) is None, name
    assert SERVER.decide("socket", [sc.AF_UNIX, 1, 0]) is None


def stacked(name: str, args: Sequence[int], *lists: DenyList) -> int | None:
    """The errno filters stacked in a process give a call (the kernel's strictest answer:
    here every refusal is an errno, and the newest filter's wins), or None if allowed."""
    answers = [deny_list.decide(name, args) for deny_list in lists]
    refused = [err for err in answers if err is not None]
    return refused[-1] if refused else None


@pytest.mark.parametrize("helper", sorted(HELPERS))
def test_helpers_keep_none_of_the_servers_allowances_they_do_not_need(helper: str) -> None:
    """Stacked over SERVER, a helper may not copy another process's descriptors, make
    namespaces, mount, lead a session or start a process; what it does stays allowed."""
    deny_list = HELPERS[helper]
    taken_back = set(SERVER_ALLOWANCES) - {"socket"}
    for name in ("pidfd_getfd", "ptrace", "process_vm_readv", "kcmp", *taken_back):
        # Arguments a server would use: new PID namespace flags, a unix socket pair.
        args = [sc.AF_UNIX, 1, 0] if name == "socketpair" else [sc.CLONE_NEWPID]
        assert stacked(name, args, SERVER, deny_list) is not None, name
    for name in ("clone", "fork", "vfork", "execve", "execveat"):
        assert stacked(name, [0x11], SERVER, deny_list) == errno.EPERM, name  # fork's flags
    for name in ("read", "write", "openat", "getdents64", "close", "epoll_wait", "accept4"):
        assert stacked(name, [0, 0, 0], SERVER, deny_list) is None, name
    assert stacked("socket", [sc.AF_INET, 1, 0], SERVER, deny_list) == errno.EPERM
    assert stacked("socket", [sc.AF_NETLINK, 3, 0], SERVER, deny_list) == errno.EPERM
    # Only the relay opens a socket: a unix one, to the host's egress proxy.
    unix = stacked("socket", [sc.AF_UNIX, 1, 0], SERVER, deny_list)
    assert unix == (None if deny_list is RELAY else errno.EPERM)
    assert all(rule.why for rule in deny_list.rules)


@pytest.mark.parametrize("arch", ARCHES)
def test_helper_programs_are_the_helpers_lists_compiled(arch: sc.Arch) -> None:
    """What a backend sends the server for its helpers: each list, compiled for the arch."""
    programs = helper_programs(arch)
    assert set(programs) == set(HELPERS) == {"file_worker", "relay"}
    for name, program in programs.items():
        assert program == compile_bpf(HELPERS[name], arch)
    assert helper_programs(arch) is programs  # compiled once per process


def test_calls_as_root_answers_chown_with_success_and_audit_as_absent() -> None:
    """Under root_identity the chown family succeeds without running (errno 0), the audit
    socket is refused as on a kernel without audit, and everything else is as for CALLS."""
    for name in ("chown", "fchown", "lchown", "fchownat"):
        assert CALLS_AS_ROOT.decide(name) == 0
        assert CALLS.decide(name) is None
        if syscall_number(name, "x86_64") is not None:
            assert verdict("x86_64", name, (), CALLS_AS_ROOT) == ERRNO  # errno 0: success
    audit = [sc.AF_NETLINK, 3, sc.NETLINK_AUDIT]
    assert CALLS_AS_ROOT.decide("socket", audit) == errno.EPROTONOSUPPORT
    assert CALLS.decide("socket", audit) == errno.EPERM
    assert CALLS_AS_ROOT.decide("socket", [sc.AF_NETLINK, 3, 15]) == errno.EPERM
    assert set(CALLS.rules) < set(CALLS_AS_ROOT.rules)
    assert sc.calls_list(root_identity=True) is CALLS_AS_ROOT
    assert sc.calls_list(root_identity=False) is CALLS


@pytest.mark.parametrize(
    ("base", "relaxed"),
    [(CALLS, CALLS_TOOL_SERVERS), (CALLS_AS_ROOT, CALLS_AS_ROOT_TOOL_SERVERS)],
    ids=["calls", "calls_as_root"],
)
def test_tool_servers_lists_differ_only_in_sockets_and_sessions(
    base: DenyList, relaxed: DenyList
) -> None:
    """Under tool_servers setsid, setpgid and unix sockets are allowed; every other rule,
    and every other socket family, is refused exactly as without it."""
    assert set(base.syscalls) - set(relaxed.syscalls) == {"setsid", "setpgid"}
    for name in ("setsid", "setpgid"):
        assert base.decide(name) == errno.EPERM
        assert relaxed.decide(name) is None
    assert base.decide("socket", [sc.AF_UNIX, 1, 0]) == errno.EPERM
    assert relaxed.decide("socket", [sc.AF_UNIX, 1, 0]) is None
    for family in (AF_VSOCK, AF_PACKET, 0xFFFF):
        assert relaxed.decide("socket", [family, 1, 0]) == errno.EPERM
    audit = [sc.AF_NETLINK, 3, sc.NETLINK_AUDIT]
    assert relaxed.decide("socket", audit) == base.decide("socket", audit)
    others = [r for r in base.rules if r.syscall not in ("setsid", "setpgid", "socket")]
    assert [r for r in relaxed.rules if r.syscall not in ("socket",)] == others
    assert relaxed.decide("ioctl", [0, sc.TIOCSTI]) == errno.EPERM
    assert sc.calls_list(base is CALLS_AS_ROOT, tool_servers=True) is relaxed


def test_profiles_are_found_by_name() -> None:
    """Each backend can name a list instead of importing it."""
    assert PROFILES == {
        "calls": CALLS,
        "calls_as_root": CALLS_AS_ROOT,
        "calls_tool_servers": CALLS_TOOL_SERVERS,
        "calls_as_root_tool_servers": CALLS_AS_ROOT_TOOL_SERVERS,
        "server": SERVER,
        "file_worker": FILE_WORKER,
        "relay": RELAY,
    }
    assert compile_bpf("server", "x86_64") == compile_bpf(SERVER, "x86_64")
    with pytest.raises(ValueError, match="unknown seccomp profile 'nope'"):
        compile_bpf("nope", "x86_64")


def test_unknown_arch_is_refused() -> None:
    """Compiling for an architecture without tables says which ones exist."""
    with pytest.raises(ValueError, match="supported: x86_64, aarch64"):
        compile_bpf(CALLS, "riscv64")


def test_unknown_syscall_is_refused() -> None:
    """A rule naming a call missing from the tables fails when the rule is built."""
    with pytest.raises(ValueError, match="unknown system call 'frobnicate'"):
        Rule(syscall="frobnicate", why="no such call exists")


def test_mixed_rules_for_one_syscall_are_refused() -> None:
    """A call refused outright may not also carry conditional rules."""
    rules = (
        Rule(syscall="socket", why="all sockets"),
        Rule(syscall="socket", why="unix", when=ArgEquals(index=0, name="domain", value=1)),
    )
    with pytest.raises(ValueError, match="more than once"):
        DenyList(name="bad", rules=rules)


def test_condition_values_must_fit_their_width() -> None:
    """A 32-bit argument cannot be compared with a 64-bit value."""
    with pytest.raises(ValueError, match="does not fit 32 bits"):
        ArgEquals(index=0, name="domain", value=1 << 32)
    with pytest.raises(ValueError, match="argument index"):
        ArgHasBits(index=6, name="x", mask=1)


def test_syscall_tables_agree_on_shared_numbers() -> None:
    """Calls numbered alike on both architectures (io_uring and later) match, and aarch64 lacks iopl."""
    for name in ("io_uring_setup", "open_tree", "clone3", "pidfd_getfd", "open_tree_attr"):
        assert syscall_number(name, "x86_64") == syscall_number(name, "aarch64")
    assert syscall_number("iopl", "aarch64") is None
    assert syscall_number("ptrace", "x86_64") == 101
    assert syscall_number("ptrace", "aarch64") == 117


def test_available_arch_is_this_machine() -> None:
    """This host is one of the supported architectures."""
    assert available_arch() in ARCHES


# --- the BPF program ---------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_program_checks_architecture_first(arch: sc.Arch) -> None:
    """A call from any other ABI (i386, AArch32, the other 64-bit arch) kills the process."""
    program = compile_bpf(CALLS, arch)
    for foreign in (sc.AUDIT_ARCH_I386, 0x40000028, *sc.AUDIT_ARCH.values()):
        if foreign != sc.AUDIT_ARCH[arch]:
            # getpid's number on i386 is 20: harmless calls are killed too.
            assert run_bpf(program, seccomp_data(20, foreign)) == KILL
    assert decode(program)[0] == (sc.BPF_LD_W_ABS, 0, 0, 4)


def test_program_kills_x32_calls() -> None:
    """On x86_64 every number with the x32 bit is killed, harmless or not."""
    program = compile_bpf(CALLS, "x86_64")
    native = sc.AUDIT_ARCH["x86_64"]
    for nr in (0x40000000, 0x40000000 | 39, 0x40000000 | 101, 0x4FFFFFFF, 0x80000000):
        assert run_bpf(program, seccomp_data(nr, native)) == KILL
    # -1 is not a call; the kernel answers ENOSYS itself, as libseccomp also lets it through.
    assert run_bpf(program, seccomp_data(-1, native)) == ALLOW


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    "profile",
    [CALLS, CALLS_AS_ROOT, SERVER, FILE_WORKER, RELAY],
    ids=["calls", "calls_as_root", "server", "file_worker", "relay"],
)
def test_program_matches_reference_for_every_rule(arch: sc.Arch, profile: DenyList) -> None:
    """Every call the tables know gets exactly the deny list's verdict, with args at rest."""
    for name in sc._TABLES[arch]:
        assert verdict(arch, name, (), profile) == expected(profile, name), name


@pytest.mark.parametrize("arch", ARCHES)
def test_program_allows_everything_else(arch: sc.Arch) -> None:
    """Numbers no rule names (read, write, getpid, high unknown numbers) are allowed."""
    program = compile_bpf(CALLS, arch)
    named = set(sc._TABLES[arch].values())
    for nr in range(600):
        data = seccomp_data(nr, sc.AUDIT_ARCH[arch])
        if nr not in named:
            assert run_bpf(program, data) == ALLOW, nr


#: Every call with a conditional rule in either list.
CONDITIONAL = sorted({r.syscall for r in (*CALLS.rules, *SERVER.rules) if r.when is not None})
#: Values for rules that look at two arguments (creation flags and mode, domain and protocol).
PAIR_ARGS = (0, 2, 4, 15, 16, sc.O_CREAT, sc.O_TMPFILE_BIT, 0o4755, 0o2000, 0o755, (1 << 32) | 16)

EDGE_ARGS = (
    0,
    16,
    40,
    0o4000,
    0o2755,
    (1 << 32) | 0o4755,
    (1 << 32) | 0o755,
    0o100 | 2,
    1,
    2,
    10,
    sc.TIOCSTI,
    sc.TIOCLINUX,
    0x541B,
    0xFFFFFFFF,
    1 << 32,
    (1 << 32) | 1,
    (1 << 32) | sc.TIOCSTI,
    (0xFFFFFFFF << 32) | sc.TIOCLINUX,
    (1 << 32) | 0xFFFFFFFF,
    0x0040000,
    (7 << 32) | 0x0040000,
    0x17 | sc.CLONE_NEWUSER,
    0x11 | (1 << 40),
    0x11,
    *(1 << b for b in range(0, 64, 3)),
)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", [*CONDITIONAL, "socketpair"])
@pytest.mark.parametrize(
    "profile", [CALLS, CALLS_AS_ROOT, SERVER], ids=["calls", "calls_as_root", "server"]
)
def test_program_argument_edges(arch: sc.Arch, name: str, profile: DenyList) -> None:
    """Conditional rules agree with the reference for low words, high words and both."""
    if syscall_number(name, arch) is None:
        return
    for args in _edge_arg_lists():
        assert verdict(arch, name, args, profile) == expected(profile, name, args), (name, args)


def _edge_arg_lists() -> list[list[int]]:
    """Each edge value in each of the first four arguments, and pairs for two-argument rules."""
    lists = []
    for value in EDGE_ARGS:
        for index in range(4):
            args = [0] * 6
            args[index] = value
            lists.append(args)
    for first in PAIR_ARGS:
        for second in PAIR_ARGS:
            for index in range(3):
                args = [0] * 6
                args[index], args[index + 1] = first, second
                lists.append(args)
            lists.append([first, 3, second, 0, 0, 0])  # socket(domain, type, protocol)
    return lists


def test_high_word_cannot_smuggle_a_32_bit_argument() -> None:
    """TIOCSTI, AF_UNIX and personalities are refused even with junk in the high word."""
    ioctl = sc.SECCOMP_RET_ERRNO | errno.EPERM
    assert verdict("x86_64", "ioctl", [0, (1 << 32) | sc.TIOCSTI]) == ioctl
    assert verdict("x86_64", "socket", [(5 << 32) | 1]) == ioctl
    assert verdict("x86_64", "personality", [(1 << 32) | 0x0040000]) == ioctl
    # The kernel reads personality(2^32 + 0xffffffff) as the query; so does the filter.
    assert verdict("x86_64", "personality", [(1 << 32) | 0xFFFFFFFF]) == ALLOW
    assert verdict("x86_64", "socket", [(1 << 32) | 2]) == ALLOW
    assert verdict("x86_64", "socket", [(1 << 32) | 40]) == ioctl
    assert verdict("x86_64", "chmod", [0, (1 << 32) | 0o4755]) == ioctl


def test_clone_checks_each_namespace_flag() -> None:
    """Each namespace flag alone refuses clone; fork's and threads' flags do not."""
    for flag in (sc.CLONE_NEWNS, sc.CLONE_NEWCGROUP, sc.CLONE_NEWUTS, sc.CLONE_NEWIPC):
        assert verdict("aarch64", "clone", [flag | 17]) == ERRNO | errno.EPERM
    for flag in (sc.CLONE_NEWUSER, sc.CLONE_NEWPID, sc.CLONE_NEWNET, sc.CLONE_NEWTIME):
        assert verdict("x86_64", "clone", [flag | 17]) == ERRNO | errno.EPERM
    fork_flags = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
    thread_flags = 0x003D0F00
    assert verdict("x86_64", "clone", [fork_flags]) == ALLOW
    assert verdict("x86_64", "clone", [thread_flags]) == ALLOW


def test_program_uses_only_known_instructions_and_fits() -> None:
    """The program is loads, forward jumps and returns, well under the kernel's limit."""
    for arch in ARCHES:
        insns = decode(compile_bpf(CALLS, arch))
        assert 10 < len(insns) < 400
        codes = {insn[0] for insn in insns}
        assert codes <= {
            sc.BPF_LD_W_ABS,
            sc.BPF_RET_K,
            sc.BPF_JMP_JA,
            sc.BPF_JMP_JEQ_K,
            sc.BPF_JMP_JGE_K,
            sc.BPF_JMP_JSET_K,
        }
        assert insns[-1][0] == sc.BPF_RET_K


def test_compile_is_deterministic() -> None:
    """The same list compiles to the same bytes (bwrap argv and caches may rely on it)."""
    assert compile_bpf(CALLS, "x86_64") == compile_bpf(CALLS, "x86_64")
    assert compile_bpf(CALLS, "x86_64") != compile_bpf(CALLS, "aarch64")


def _long_list(size: int) -> DenyList:
    """A list whose conditional rules stretch jumps past 255 instructions."""
    values = tuple(range(100, 100 + size))
    rules = [
        Rule(syscall="ioctl", why=f"cmd {v}", when=ArgEquals(index=1, name="cmd", value=v))
        for v in values
    ]
    rules.append(
        Rule(
            syscall="personality",
            why="allow-list far longer than a jump",
            when=ArgNotIn(index=0, name="persona", values=values, width=64),
        )
    )
    return DenyList(
        name="long", rules=(*rules, *CALLS.without("ioctl", "personality", name="x").rules)
    )


@pytest.mark.parametrize("size", [1, 200, 400])
def test_long_programs_resolve_far_jumps(size: int) -> None:
    """Programs with hundreds of instructions between a jump and its target still run right."""
    profile = _long_list(size)
    program = compile_bpf(profile, "x86_64")
    insns = decode(program)
    if size > 200:
        assert len(insns) > 1000
        assert any(code == sc.BPF_JMP_JA and k > 255 for code, _, _, k in insns)
    for cmd in (99, 100, 100 + size // 2, 100 + size - 1, 100 + size, (1 << 32) | 100):
        assert verdict("x86_64", "ioctl", [0, cmd], profile) == expected(profile, "ioctl", [0, cmd])
    for persona in (0, 100, 100 + size - 1, 100 + size, (1 << 32) | 100):
        got = verdict("x86_64", "personality", [persona], profile)
        assert got == expected(profile, "personality", [persona])
    assert verdict("x86_64", "setsid", [], profile) == ERRNO | errno.EPERM
    assert verdict("x86_64", "kcmp", [], profile) == ERRNO | errno.EPERM


def test_programs_past_the_kernel_limit_are_refused() -> None:
    """A list too long for one seccomp program fails to compile instead of failing to install."""
    with pytest.raises(ValueError, match="exceeds 4096 instructions"):
        compile_bpf(_long_list(1000), "x86_64")


def test_assembler_routes_a_far_branch_through_a_trampoline() -> None:
    """A conditional jump 300 instructions away becomes a short jump to a `ja`."""
    asm = sc._Assembler()
    far = asm.label()
    asm.load(0)
    asm.jump(sc.BPF_JMP_JEQ_K, 7, far, None)
    for _ in range(300):
        asm.load(4)
    asm.ret(sc.SECCOMP_RET_ALLOW)
    asm.mark(far)
    asm.ret(sc.SECCOMP_RET_KILL_PROCESS)
    program = asm.assemble()
    insns = decode(program)
    assert insns[1] == (sc.BPF_JMP_JEQ_K, 0, 1, 7)
    assert insns[2] == (sc.BPF_JMP_JA, 0, 0, 301)
    assert run_bpf(program, seccomp_data(7, 0)) == KILL
    assert run_bpf(program, seccomp_data(8, 0)) == ALLOW


def test_assembler_refuses_backward_jumps() -> None:
    """Classic BPF only jumps forward; a label placed before its jump is an error."""
    asm = sc._Assembler()
    back = asm.label()
    asm.mark(back)
    asm.load(0)
    asm.goto(back)
    with pytest.raises(ValueError, match="backwards"):
        asm.assemble()


# --- kafel -------------------------------------------------------------------


def test_kafel_policy_shape() -> None:
    """The kafel text defaults to ALLOW, kills x32 numbers and masks 32-bit arguments."""
    text = to_kafel(CALLS, "x86_64")
    assert text.startswith("POLICY astralvessel_calls {")
    assert text.rstrip().endswith("USE astralvessel_calls DEFAULT ALLOW")
    assert "KILL_PROCESS { SYSCALL[0x40000000], SYSCALL[0x40000001]," in text
    assert "SYSCALL[0x400003ff] }" in text
    assert "SYSCALL[16] /* ioctl */ (arg0, cmd) { (cmd & 0xffffffff) == 0x5412," in text
    assert "SYSCALL[56] /* clone */ (flags) { (flags & 0x7e020080) != 0 }" in text
    assert (
        "ERRNO(38) {\n    SYSCALL[437] /* openat2 */,\n    SYSCALL[253] /* inotify_init */," in text
    )
    assert "    SYSCALL[435] /* clone3 */\n  }" in text
    assert (
        "SYSCALL[257] /* openat */ (arg0, arg1, flags, mode) { (flags & 0x400040) != 0 && " in text
    )
    assert (
        "SYSCALL[41] /* socket */ (domain, arg1, protocol) { (domain & 0xffffffff) != 0x2 && "
        in text
    )


def test_kafel_policy_without_x32_leaves_only_the_deny_list() -> None:
    """``x32=False`` drops exactly the x32 block: for a process that stacks ``x32_guard``."""
    full = to_kafel(SERVER, "x86_64")
    lean = to_kafel(SERVER, "x86_64", x32=False)
    assert "0x40000" not in lean
    assert "KILL_PROCESS" not in lean
    assert full.replace(full[full.index("  KILL_PROCESS") : full.index("  ERRNO(")], "") == lean


def test_x32_guard_exists_only_for_x86_64() -> None:
    """The guard is a handful of instructions on x86_64 and nothing on aarch64 (no x32 ABI)."""
    program = x32_guard("x86_64")
    assert program is not None
    assert 0 < len(program) // 8 <= 8
    assert len(program) % 8 == 0
    assert x32_guard("aarch64") is None


def test_kafel_policy_for_aarch64_has_no_x32_block() -> None:
    """On aarch64 there is no x32 ABI to refuse and no iopl to name."""
    text = to_kafel(CALLS, "aarch64")
    assert "KILL_PROCESS" not in text
    assert "iopl" not in text
    assert "SYSCALL[117] /* ptrace */" in text


# --- Docker ------------------------------------------------------------------


def _docker_decides(profile: dict[str, object], name: str, args: Sequence[int]) -> int | None:
    """Evaluate a Docker profile the way libseccomp does: any matching entry refuses."""
    entries = profile["syscalls"]
    assert isinstance(entries, list)
    for entry in entries:
        if name not in entry["names"]:
            continue
        ok = True
        for cmp in entry["args"]:
            arg = args[cmp["index"]] & MASK64
            if cmp["op"] == "SCMP_CMP_EQ":
                ok &= arg == cmp["value"]
            elif cmp["op"] == "SCMP_CMP_MASKED_EQ":
                ok &= arg & cmp["value"] == cmp["valueTwo"]
            else:
                raise AssertionError(cmp["op"])
        if ok:
            return int(entry["errnoRet"])
    return None


@pytest.mark.parametrize("arch", ARCHES)
def test_docker_profile_schema(arch: sc.Arch) -> None:
    """The profile is JSON with Docker's keys, one architecture and one comparison per argument."""
    profile = to_docker_profile(CALLS, arch)
    assert json.loads(json.dumps(profile)) == profile
    assert set(profile) == {"defaultAction", "architectures", "syscalls"}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["architectures"] == [
        {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}[arch]
    ]
    entries = profile["syscalls"]
    assert isinstance(entries, list)
    for entry in entries:
        assert entry["action"] == "SCMP_ACT_ERRNO"
        assert entry["errnoRet"] in (errno.EPERM, errno.ENOSYS)
        assert entry["names"]
        assert all(syscall_number(n, arch) is not None for n in entry["names"])
        indexes = [cmp["index"] for cmp in entry["args"]]
        assert len(indexes) == len(set(indexes)), "libseccomp allows one comparison per argument"
        for cmp in entry["args"]:
            assert cmp["op"] in ("SCMP_CMP_EQ", "SCMP_CMP_MASKED_EQ")
            assert 0 <= cmp["value"] <= MASK64


@pytest.mark.parametrize("profile", [CALLS, SERVER], ids=["calls", "server"])
def test_docker_profile_matches_reference(profile: DenyList) -> None:
    """Evaluated like libseccomp, the Docker profile refuses exactly what the list refuses."""
    docker = to_docker_profile(profile, "x86_64")
    for name in sc._TABLES["x86_64"]:
        arg_lists = _edge_arg_lists() if name in CONDITIONAL else [[0] * 6]
        for args in arg_lists:
            assert _docker_decides(docker, name, args) == profile.decide(name, args), (name, args)


def test_docker_expresses_small_allow_lists_exactly() -> None:
    """An allow-list of values spanning few bits becomes exact masked comparisons."""
    rule = Rule(
        syscall="socket",
        why="test list",
        when=ArgNotIn(index=0, name="domain", values=(2, 10, 16)),
    )
    listed = DenyList(name="few", rules=(rule,))
    docker = to_docker_profile(listed, "x86_64")
    for value in [*range(64), 1 << 31, (1 << 32) | 2, 0xFFFFFFFF]:
        args = [value, 0, 0, 0, 0, 0]
        assert _docker_decides(docker, "socket", args) == listed.decide("socket", args), value


def test_docker_cannot_express_arbitrary_allow_lists() -> None:
    """An allow-list whose values span too many bits is refused with a clear message."""
    rule = Rule(
        syscall="personality",
        why="test list",
        when=ArgNotIn(index=0, name="persona", values=(0x12345678,)),
    )
    with pytest.raises(ValueError, match="cannot express persona not in"):
        to_docker_profile(DenyList(name="odd", rules=(rule,)), "x86_64")


def test_rules_are_frozen_values() -> None:
    """Rules and lists are immutable values that compare by content."""
    rule = CALLS.rules[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rule.errno = 2  # type: ignore[misc]
    assert attrs.evolve(rule) == rule


def test_docs_name_every_refused_call() -> None:
    """The documentation page explains every system call the calls and helpers' lists refuse."""
    page = (Path(__file__).parents[2] / "docs" / "seccomp.md").read_text()
    names = {*CALLS.syscalls, *(n for deny_list in HELPERS.values() for n in deny_list.syscalls)}
    missing = sorted(name for name in names if f"`{name}`" not in page)
    assert missing == []
