"""Promises: an unprivileged user with no capabilities, no_new_privs, and a seccomp filter."""

from __future__ import annotations

import errno
import os
import platform

import pytest

from astralvessel.sandbox.docker._exec_session import ExecSession

from .calls import py, py_json

#: Numbers of the refused system calls, per architecture (from the kernel's syscall tables).
SYSCALLS = {
    "x86_64": {
        "ptrace": 101,
        "mount": 165,
        "unshare": 272,
        "setns": 308,
        "keyctl": 250,
        "add_key": 248,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "kexec_load": 246,
        "init_module": 175,
        "open_by_handle_at": 304,
    },
    "aarch64": {
        "ptrace": 117,
        "mount": 40,
        "unshare": 97,
        "setns": 268,
        "keyctl": 219,
        "add_key": 217,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "io_uring_setup": 425,
        "kexec_load": 104,
        "init_module": 105,
        "open_by_handle_at": 265,
    },
}
CLONE_NEWUSER = 0x10000000


def test_runs_as_unprivileged_host_user(session, backend):
    """Every uid and gid of a call is one unprivileged id; no supplementary group beyond it is
    named, and on a root host none is held."""
    result = py_json(
        session,
        "import json, os; print(json.dumps([os.getresuid(), os.getresgid(), os.getgroups()]))",
    )
    uids, gids, groups = result
    # 65534 wherever a server maps a call's ids; docker-exec's calls are the turn's own host uid.
    own = session.uid if isinstance(session, ExecSession) else 65534
    assert (uids, gids) == ([own] * 3, [own] * 3)
    if os.geteuid() != 0 and backend.name in ("bubblewrap", "nsjail"):
        # An unprivileged user namespace must deny setgroups before it maps a gid, so
        # no process in it may drop the host user's groups: each stays attached (the
        # documented limit of an ordinary-user host), shown as 65534, a gid the call's
        # namespace does not name, and grants only what the sandbox's view lets it reach.
        assert groups == [65534] * len(os.getgroups())
    else:
        # Docker always lists the primary gid as a supplementary group and, with no
        # capabilities, cannot drop it; a group equal to the primary one grants nothing.
        assert groups in ([], [own])


def test_a_kept_group_reaches_no_engine_socket(session):
    """The container engine's socket, the usual prize of a group an ordinary user keeps
    (``docker``, as CI's user is), is not in a call's view at any of its usual paths."""
    found = py_json(
        session,
        """
        import json, os
        paths = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
                 "/run/podman/podman.sock", "/var/run/containerd/containerd.sock"]
        print(json.dumps([p for p in paths if os.path.lexists(p)]))
        """,
    )
    assert found == []


def test_no_capabilities_and_no_new_privs(session):
    """A call holds no capability in any set, has no_new_privs set and runs under a seccomp filter."""
    status = py_json(
        session,
        """
        import json
        fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
        print(json.dumps({k: v.strip() for k, v in fields.items()}))
        """,
    )
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, field
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"


def test_securebits_locked(session):
    """The securebits that would hand uid 0 or an exec capabilities are set and locked."""
    bits = py_json(
        session,
        """
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        print(json.dumps(libc.prctl(27, 0, 0, 0, 0)))  # PR_GET_SECUREBITS
        """,
    )
    # NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each locked, and KEEP_CAPS locked off.
    assert bits == 0xEF


def test_cannot_reconfigure_the_network(session):
    """Taking the loopback down (``ip link set lo down``) and raw sockets are refused."""
    result = py_json(
        session,
        """
        import fcntl, json, socket, struct
        found = {}
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # SIOCSIFFLAGS with no flags: what `ip link set lo down` asks of the kernel.
            fcntl.ioctl(sock, 0x8914, struct.pack("16sH22x", b"lo", 0))
            found["lo down"] = "done"
        except OSError as exc:
            found["lo down"] = exc.errno
        for name, family, kind, proto in (
            ("raw ip", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
            ("packet", socket.AF_PACKET, socket.SOCK_RAW, 0),
        ):
            try:
                socket.socket(family, kind, proto).close()
                found[name] = "opened"
            except OSError as exc:
                found[name] = exc.errno
        print(json.dumps(found))
        """,
    )
    assert result == {"lo down": errno.EPERM, "raw ip": errno.EPERM, "packet": errno.EPERM}


def test_cannot_become_root(session):
    """``setuid(0)`` fails, and su/sudo-style escalation is blocked by no_new_privs."""
    result = py_json(
        session,
        """
        import json, os
        try:
            os.setuid(0)
            print(json.dumps("root"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    # EINVAL where uid 0 does not exist in the call's one-uid user namespace (Docker).
    assert result in (errno.EPERM, errno.EINVAL)


@pytest.mark.parametrize("name", sorted(SYSCALLS["x86_64"]))
def test_dangerous_syscall_refused(session, name):
    """Each dangerous system call the filter names fails with EPERM."""
    number = SYSCALLS[platform.machine()][name]
    # unshare gets a real namespace flag; other calls fail on the filter before reading arguments.
    first = CLONE_NEWUSER if name == "unshare" else 0
    result = py_json(
        session,
        f"""
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall({number}, ctypes.c_long({first}), 0, 0, 0, 0, 0)
        print(json.dumps(rc if rc >= 0 else -ctypes.get_errno()))
        """,
    )
    assert result == -errno.EPERM


def test_clone_with_namespace_flags_refused(session):
    """``clone`` asking for a new namespace fails, while a plain fork still works."""
    result = py_json(
        session,
        f"""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        nr = {{"x86_64": 56, "aarch64": 220}}[{platform.machine()!r}]
        rc = libc.syscall(nr, ctypes.c_long({CLONE_NEWUSER} | 17), 0, 0, 0, 0)
        if rc == 0:
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, status = os.waitpid(pid, 0)
        print(json.dumps([rc if rc >= 0 else -ctypes.get_errno(), os.waitstatus_to_exitcode(status)]))
        """,
    )
    assert result == [-errno.EPERM, 7]


_FOREIGN_ABI = """
import ctypes, json, mmap, os, signal
def attempt(code):
    pid = os.fork()
    if pid == 0:
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        ctypes.CFUNCTYPE(ctypes.c_long)(address)()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)
out = {}
# mov eax, 0x40000027 (getpid | __X32_SYSCALL_BIT); syscall; ret
out["x32"] = attempt(bytes.fromhex("b827000040") + bytes.fromhex("0f05c3"))
# mov eax, 20 (i386 getpid); int 0x80; ret
out["i386"] = attempt(bytes.fromhex("b814000000") + bytes.fromhex("cd80c3"))
print(json.dumps(out))
"""


def test_foreign_abi_syscalls_kill_the_process(session):
    """x32 and i386 system calls (a classic filter bypass) kill the process that makes them."""
    if platform.machine() != "x86_64":
        # Only x86_64 has the foreign ABIs; on aarch64 the architecture check covers arm32.
        result = {"x32": 31, "i386": 31}
    else:
        result = py_json(session, _FOREIGN_ABI)
    assert result == {"x32": 31, "i386": 31}  # SIGSYS


def test_io_uring_not_usable(session):
    """io_uring cannot be set up, so no system call can bypass the filter through it."""
    outcome = py(
        session,
        f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)
        rc = libc.syscall({SYSCALLS[platform.machine()]["io_uring_setup"]}, 8, params)
        print(rc, ctypes.get_errno())
        """,
    )
    assert outcome.output.split() == ["-1", str(errno.EPERM)]
