"""The deny list and its compiled forms, checked as values.

The BPF program is run here by a small classic-BPF interpreter over synthetic
``seccomp_data``, which reaches what a live process cannot easily produce: an
i386 or AArch32 caller, every rule on the other architecture, high words set.
"""

from __future__ import annotations

import errno
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from astralvessel.sandbox import _seccomp as sc
from astralvessel.sandbox._seccomp import (
    CALLS,
    PROFILES,
    SERVER,
    ArgEquals,
    ArgHasBits,
    ArgNotIn,
    DenyList,
    Rule,
    available_arch,
    compile_bpf,
    syscall_number,
    to_docker_profile,
    to_kafel,
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


def seccomp_data(nr: int, arch: int, args: Sequence[int] = ()) -> bytes:
    """Pack ``struct seccomp_data`` as a little-endian kernel would."""
    padded = [a & MASK64 for a in (*args, *(0,) * (6 - len(args)))]
    return struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0x400000, *padded)


def run_bpf(program: bytes, data: bytes) -> int:
    """Run a seccomp program on ``data`` and return its verdict, checking every jump."""
    insns = decode(program)
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
    return run_bpf(compile_bpf(profile, arch), seccomp_data(nr, sc.AUDIT_ARCH[arch], args))


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


def test_clone3_is_refused_with_enosys() -> None:
    """clone3 answers ENOSYS so libc falls back to clone, whose flags the filter can read."""
    assert CALLS.decide("clone3") == errno.ENOSYS
    assert {r.errno for r in CALLS.rules if r.syscall != "clone3"} == {errno.EPERM}


def test_server_list_is_a_subset_allowing_namespace_work() -> None:
    """The server list keeps the dangerous calls but allows what launching calls needs."""
    assert set(SERVER.rules) < set(CALLS.rules)
    for needed in ("unshare", "mount", "setpgid", "setsid", "setns", "clone", "socket", "chroot"):
        assert needed not in SERVER.syscalls
    for refused in ("ptrace", "kexec_load", "init_module", "bpf", "keyctl", "perf_event_open"):
        assert refused in SERVER.syscalls
    for refused in ("userfaultfd", "io_uring_setup", "reboot", "open_by_handle_at"):
        assert refused in SERVER.syscalls
    assert SERVER.decide("ioctl", [0, sc.TIOCSTI]) == errno.EPERM


def test_profiles_are_found_by_name() -> None:
    """Each backend can name a list instead of importing it."""
    assert PROFILES == {"calls": CALLS, "server": SERVER}
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
@pytest.mark.parametrize("profile", [CALLS, SERVER], ids=["calls", "server"])
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


EDGE_ARGS = (
    0,
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
@pytest.mark.parametrize("name", ["socket", "socketpair", "ioctl", "clone", "personality"])
def test_program_argument_edges(arch: sc.Arch, name: str) -> None:
    """Conditional rules agree with the reference for low words, high words and both."""
    for value in EDGE_ARGS:
        for index in (0, 1):
            args = [0, 0, 0]
            args[index] = value
            assert verdict(arch, name, args) == expected(CALLS, name, args), (name, index, value)


def test_high_word_cannot_smuggle_a_32_bit_argument() -> None:
    """TIOCSTI, AF_UNIX and personalities are refused even with junk in the high word."""
    ioctl = sc.SECCOMP_RET_ERRNO | errno.EPERM
    assert verdict("x86_64", "ioctl", [0, (1 << 32) | sc.TIOCSTI]) == ioctl
    assert verdict("x86_64", "socket", [(5 << 32) | 1]) == ioctl
    assert verdict("x86_64", "personality", [(1 << 32) | 0x0040000]) == ioctl
    # The kernel reads personality(2^32 + 0xffffffff) as the query; so does the filter.
    assert verdict("x86_64", "personality", [(1 << 32) | 0xFFFFFFFF]) == ALLOW
    assert verdict("x86_64", "socket", [(1 << 32) | 2]) == ALLOW


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
    assert "ERRNO(38) {\n    SYSCALL[435] /* clone3 */\n  }" in text


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
        for value in EDGE_ARGS:
            for index in (0, 1):
                args = [0] * 6
                args[index] = value
                assert _docker_decides(docker, name, args) == profile.decide(name, args), (
                    name,
                    value,
                )


def test_docker_cannot_express_arbitrary_allow_lists() -> None:
    """An allow-list of values beyond 0 and 0xffffffff is refused with a clear message."""
    rule = Rule(
        syscall="personality", why="test list", when=ArgNotIn(index=0, name="persona", values=(8,))
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
    """The documentation page explains every system call the calls list refuses."""
    page = (Path(__file__).parents[2] / "docs" / "seccomp.md").read_text()
    missing = [name for name in CALLS.syscalls if f"`{name}`" not in page]
    assert missing == []
