"""The server's confined launch, run directly as root: PID namespace, uid drop, rlimits, seccomp."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.errors import PromiseNotEnforcedError, SandboxError
from astralvessel.sandbox._base import RunRequest
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._policy import Limits, Policy
from astralvessel.sandbox._seccomp import CALLS, available_arch, compile_bpf
from astralvessel.sandbox._session import ServerSession, server_command
from tests.conformance.calls import file_tool

SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A host folder standing in for /workspace, reachable by the unprivileged uid."""
    with tempfile.TemporaryDirectory(prefix="vessel-ws-", dir="/tmp") as path:
        os.chmod(path, 0o755)  # noqa: S103 - the unprivileged uid must reach it
        yield Path(path)


def start(
    workspace: Path, *, seccomp: bytes | None = None, policy: Policy | None = None
) -> ServerSession:
    """Start a root server that confines its calls to uid 65534 in fresh namespaces."""
    channel = PipeChannel.spawn(server_command(sys.executable), name="root-test")
    return ServerSession.start(
        channel,
        policy or Policy(limits=Limits(processes=64, open_files=256, disk_mb=8, memory_mb=512)),
        backend="root-test",
        confine=True,
        drop_uid=NOBODY,
        drop_gid=NOBODY,
        seccomp=seccomp,
        path_map={"/workspace": str(workspace)},
    )


@pytest.fixture
def session(workspace: Path) -> Iterator[ServerSession]:
    """A running confined server without a seccomp filter."""
    with start(workspace) as started:
        yield started


def sh(script: str, *, timeout: float = 10.0) -> RunRequest:
    """A call running ``script`` with /bin/sh."""
    return RunRequest(argv=["/bin/sh", "-c", script], timeout=timeout, output_chars=20_000)


def test_server_reports_namespaces(session: ServerSession) -> None:
    """Started as root, the server can confine calls in a PID namespace and reports no problem."""
    assert session.ready_info["pid_namespace"] is True
    assert session.ready_info["problems"] == {}


def test_call_runs_unprivileged(session: ServerSession) -> None:
    """A call runs as the dropped uid and gid with no supplementary groups and no capabilities."""
    outcome = session.run(
        sh("id -u; id -g; id -G; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
    )
    lines = outcome.output.split()
    assert lines[:3] == ["65534", "65534", "65534"]
    assert "0000000000000000" in lines
    assert lines[-1] == "1"


def test_call_sees_only_its_own_processes(session: ServerSession) -> None:
    """A call's /proc shows its own processes only: not the server, not another call."""
    blocker = threading.Thread(target=session.run, args=(sh("sleep 2"),))
    blocker.start()
    outcome = session.run(sh("ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '"))
    blocker.join()
    pids = [int(p) for p in outcome.output.split()]
    # pid 1 is the call's init, 2 its shell, then the pipeline's processes.
    assert pids[0] == 1
    assert max(pids) < 10
    assert "sleep" not in session.run(sh("cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '")).output


def test_double_forked_daemon_is_gone_after_return(session: ServerSession, workspace: Path) -> None:
    """A daemon that double-forked and left the process group is killed when the call returns."""
    script = (
        "(setsid sh -c 'trap \"\" TERM; echo $$ > daemon; exec sleep 300' &) ; sleep 0.3; echo back"
    )
    outcome = session.run(sh(script))
    assert outcome.output == "back\n"
    marker = (workspace / "daemon").read_text()
    assert marker.strip()
    assert not _sleepers()


def test_timeout_kills_the_whole_namespace(session: ServerSession) -> None:
    """A timed-out call, daemons included, is gone when run returns, and its output is kept."""
    # Long enough for the shell to start and echo on a loaded machine: a CI run under load
    # once killed the call at 0.5 s before it had written anything.
    outcome = session.run(sh("echo hi; (setsid sleep 300 &); sleep 300", timeout=3.0))
    assert outcome.timed_out
    assert outcome.output == "hi\n"
    assert not _sleepers()


def test_rlimits_apply(session: ServerSession) -> None:
    """Open files, file size, address space and core size are limited as the policy says."""
    outcome = session.run(
        sh("ulimit -n; ulimit -f; ulimit -v; ulimit -c; grep 'Max processes' /proc/self/limits")
    )
    assert outcome.output.split()[:4] == ["256", str(8 * 1024 * 2), str(512 * 1024), "0"]
    # RLIMIT_NPROC counts the call's init (which runs as the call's uid) too: one more, so the
    # call's own processes get the 64 the policy says.
    assert outcome.output.split()[6:8] == ["65", "65"]


def test_file_past_disk_limit_fails_like_a_full_disk(session: ServerSession) -> None:
    """Writing past the disk limit fails inside the call (EFBIG) rather than killing it."""
    outcome = session.run(sh("head -c 9000000 /dev/zero > $TMPDIR/big; echo status $?"))
    assert "File too large" in outcome.output
    assert outcome.output.endswith("status 1\n")


def test_outbox_file_of_another_owner_is_refused(session: ServerSession, workspace: Path) -> None:
    """The server only takes outbox files the call's user owns (root's own files stay out)."""
    outbox = workspace / "outbox"
    (outbox / "planted").write_text("root's")
    # The call can move root's file into its own outbox (it owns the folders), not take it.
    outcome = session.run(
        sh('mv "$VESSEL_OUTBOX/../planted" "$VESSEL_OUTBOX/"; echo mine > $VESSEL_OUTBOX/mine')
    )
    assert [f.name for f in outcome.files] == ["mine"]
    assert not (outbox / "planted").exists()
    assert list(outbox.iterdir()) == []


def test_file_worker_runs_unprivileged(session: ServerSession, workspace: Path) -> None:
    """File tools run as the unprivileged user: a root-only file cannot be read through them."""
    secret = workspace / "secret"
    secret.write_text("top")
    secret.chmod(0o600)
    outcome = file_tool(session, "read", {"path": "/workspace/secret"}, timeout=10)
    assert outcome.is_error
    assert "top" not in outcome.text


def test_seccomp_filter_refuses_setsid_and_unix_sockets(workspace: Path) -> None:
    """With the calls' seccomp program installed, setsid and AF_UNIX sockets are refused."""
    arch = available_arch()
    assert arch is not None
    with start(workspace, seccomp=compile_bpf(CALLS, arch)) as session:
        assert session.ready_info["seccomp"] is True
        code = (
            "import os, socket\n"
            "try:\n    os.setsid(); print('setsid ok')\nexcept OSError as e: print('setsid', e.errno)\n"
            "try:\n    socket.socket(socket.AF_UNIX); print('unix ok')\nexcept OSError as e: print('unix', e.errno)\n"
        )
        outcome = session.run(
            RunRequest(argv=["python3", "-c", code], timeout=20, output_chars=1000)
        )
    assert "setsid ok" not in outcome.output
    assert "unix ok" not in outcome.output
    assert outcome.exit_code == 0


def test_missing_privilege_refuses_to_start(workspace: Path) -> None:
    """A server that cannot make namespaces (not root) fails closed with the promise it breaks."""
    channel = PipeChannel.spawn(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            # The system interpreter: a pyenv or venv one under /root is not readable
            # by nobody (its shared libpython sits behind /root's 0700).
            *server_command(SYSTEM_PYTHON),
        ],
        name="unprivileged-test",
    )
    with pytest.raises(PromiseNotEnforcedError, match="process-isolation"):
        ServerSession.start(
            channel,
            Policy(),
            backend="unprivileged-test",
            confine=True,
            drop_uid=None,
            drop_gid=None,
            seccomp=None,
            path_map={"/workspace": str(workspace)},
        )


def _sleepers() -> list[str]:
    """Processes of the unprivileged uid still running ``sleep 300``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != NOBODY:
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"sleep\x00300"):
            found.append(entry.name)
    return found


def test_command_errors_read_as_a_shell_would_report_them(session: ServerSession) -> None:
    """A missing program exits 127, one that is not executable 126, a missing cwd 126."""
    missing = session.run(RunRequest(argv=["no-such-program-here"], timeout=10, output_chars=500))
    assert missing.exit_code == 127
    assert "cannot run 'no-such-program-here': No such file or directory" in missing.output
    not_executable = session.run(RunRequest(argv=["/etc/passwd"], timeout=10, output_chars=500))
    assert not_executable.exit_code == 126
    assert "Permission denied" in not_executable.output
    bad_cwd = session.run(
        RunRequest(argv=["/bin/true"], cwd="/no/such/dir", timeout=10, output_chars=500)
    )
    assert bad_cwd.exit_code == 126
    assert "cannot enter /no/such/dir" in bad_cwd.output


def test_path_search_uses_the_call_environment(session: ServerSession) -> None:
    """A bare program name is found on the call's PATH, as ``execvpe`` would find it."""
    outcome = session.run(RunRequest(argv=["sh", "-c", "echo $0"], timeout=10, output_chars=500))
    assert outcome.exit_code == 0
    assert outcome.output == "sh\n"


def test_nul_in_argv_is_refused_clearly(session: ServerSession) -> None:
    """An argument holding a NUL cannot reach exec; the call fails with a message saying so."""
    with pytest.raises(SandboxError, match="may not contain NUL"):
        session.run(RunRequest(argv=["/bin/echo", "a\0b"], timeout=10, output_chars=500))
    assert session.run(sh("echo fine")).output == "fine\n"


def test_call_ignores_no_signal_but_sigxfsz(workspace: Path) -> None:
    """A signal ignored by whoever started the server (SIGHUP here) is not ignored in a call."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        session = start(workspace)
    finally:
        signal.signal(signal.SIGHUP, previous)
    with session:
        outcome = session.run(
            RunRequest(argv=["grep", "SigIgn", "/proc/self/status"], timeout=10, output_chars=500)
        )
    ignored = int(outcome.output.split()[1], 16)
    # glibc's posix_spawn leaves its own two internal signals (32 and 33) ignored; a glibc
    # program re-arms them at start, and they are no signal anything else sends.
    glibc_internal = (1 << 31) | (1 << 32)
    assert ignored & ~glibc_internal == 1 << (signal.SIGXFSZ - 1)
