"""ServerSession against a real server running unconfined on this interpreter."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.errors import SandboxError
from astralvessel.sandbox._base import RunRequest
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._policy import Policy
from astralvessel.sandbox._session import ServerSession, server_command
from tests.conformance.calls import afile_tool, file_tool

from ..conformance.calls import barrier


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A host folder standing in for /workspace."""
    with tempfile.TemporaryDirectory(prefix="vessel-ws-") as path:
        yield Path(path)


@pytest.fixture
def session(workspace: Path) -> Iterator[ServerSession]:
    """A running unconfined server whose /workspace is the workspace fixture."""
    channel = PipeChannel.spawn(server_command(sys.executable), name="test")
    with ServerSession.start(
        channel,
        Policy(),
        backend="test",
        confine=False,
        drop_uid=None,
        drop_gid=None,
        seccomp=None,
        path_map={"/workspace": str(workspace)},
    ) as started:
        yield started


def sh(
    script: str, *, timeout: float = 10.0, output_chars: int = 10_000, stdin: bytes = b""
) -> RunRequest:
    """A call running ``script`` with /bin/sh."""
    return RunRequest(
        argv=["/bin/sh", "-c", script], timeout=timeout, output_chars=output_chars, stdin=stdin
    )


def test_ready_reports_the_server(session: ServerSession) -> None:
    """The ready message says which Python serves, that calls are not confined, and that it
    serves the file primitives under the name their requests have (``fs``)."""
    assert session.ready_info["python"].startswith("3.")
    assert session.ready_info["confine"] is False
    assert session.ready_info["fs"] is True
    assert "file_tools" not in session.ready_info


def test_output_is_stdout_and_stderr_in_order(session: ServerSession) -> None:
    """Stdout and stderr arrive combined in the order they were written, with the exit code."""
    outcome = session.run(sh("echo one; echo two >&2; echo three; exit 3"))
    assert outcome.output == "one\ntwo\nthree\n"
    assert outcome.exit_code == 3
    assert not outcome.timed_out


def test_stdin_reaches_the_call(session: ServerSession) -> None:
    """The request's stdin bytes are the call's standard input, then end of file."""
    data = os.urandom(300_000)
    outcome = session.run(
        RunRequest(argv=["sh", "-c", "wc -c"], stdin=data, timeout=10, output_chars=100)
    )
    assert outcome.output.strip() == "300000"


def test_environment_is_exactly_the_policys(session: ServerSession, workspace: Path) -> None:
    """A call sees only the policy's environment, with sandbox paths mapped to the host."""
    outcome = session.run(RunRequest(argv=["env"], timeout=10, output_chars=10_000))
    env = dict(line.split("=", 1) for line in outcome.output.splitlines())
    env.pop("PWD", None)  # exported by nothing; some env(1) builds print it
    assert set(env) == {"PATH", "LANG", "HOME", "TMPDIR", "VESSEL_OUTBOX"}
    assert env["HOME"] == str(workspace)
    # Each call its own outbox folder, inside the turn's outbox.
    assert Path(env["VESSEL_OUTBOX"]).parent == workspace / "outbox"


def test_missing_command_is_exit_127(session: ServerSession) -> None:
    """A command that does not exist is a normal outcome: exit 127 and a message."""
    outcome = session.run(RunRequest(argv=["no-such-command-here"], timeout=10, output_chars=1000))
    assert outcome.exit_code == 127
    assert "cannot run 'no-such-command-here'" in outcome.output


def test_killed_by_signal_is_negative(session: ServerSession) -> None:
    """A call killed by a signal reports minus the signal number."""
    assert session.run(sh("kill -9 $$")).exit_code == -9


def test_calls_run_concurrently(session: ServerSession, workspace: Path) -> None:
    """Four calls of one turn are in flight at once: each waits until all four have started."""
    results: list[str] = []

    def call(name: str) -> None:
        request = sh(barrier(str(workspace), name, 4), timeout=60)
        results.append(session.run(request).output.strip())

    threads = [threading.Thread(target=call, args=(str(n),)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Serialised calls would leave the first one waiting alone until it gave up.
    assert results == ["met"] * 4


def test_output_is_cut_and_counted(session: ServerSession) -> None:
    """Output beyond output_chars is dropped and counted in characters, never split mid-character."""
    outcome = session.run(sh("printf 'aé€😀%.0s' $(seq 100)", output_chars=10))
    assert outcome.output == "aé€😀aé€😀aé"
    assert outcome.dropped_chars == 400 - 10


def test_huge_output_keeps_host_memory_bounded(session: ServerSession) -> None:
    """A call printing 300 MB keeps at most output_chars*4 bytes on the host and counts the rest."""
    outcome = session.run(
        sh("head -c 300000000 /dev/zero | tr '\\0' a", timeout=120, output_chars=1000)
    )
    assert outcome.output == "a" * 1000
    assert outcome.dropped_chars == 300_000_000 - 1000
    assert session.max_buffered_output <= 4000


def test_timeout_keeps_output_so_far(session: ServerSession) -> None:
    """A call past its timeout is killed, keeps the output it printed, and says it timed out."""
    outcome = session.run(sh("echo started; sleep 30", timeout=0.5))
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert outcome.output == "started\n"


def test_background_process_in_group_is_gone_after_return(
    session: ServerSession, workspace: Path
) -> None:
    """A background process the call left in its process group is killed when the call returns."""
    session.run(sh("sleep 300 & echo $! > pid"))
    pid = int((workspace / "pid").read_text())
    time.sleep(0.2)
    assert not _alive(pid)


def test_outbox_files_come_back_and_outbox_is_emptied(
    session: ServerSession, workspace: Path
) -> None:
    """Files left in $VESSEL_OUTBOX come back with the call, and the next call starts empty."""
    outcome = session.run(
        sh("echo hello > $VESSEL_OUTBOX/a.txt; head -c 3000000 /dev/zero > $VESSEL_OUTBOX/big")
    )
    files = {f.name: f for f in outcome.files}
    assert set(files) == {"a.txt", "big"}
    assert files["a.txt"].path.read_text() == "hello\n"
    assert files["big"].size == 3_000_000
    assert files["big"].path.stat().st_size == 3_000_000
    assert list((workspace / "outbox").iterdir()) == []
    assert session.run(sh("true")).files == ()


def test_outbox_symlink_is_not_followed(session: ServerSession, workspace: Path) -> None:
    """A symbolic link in the outbox is removed, never followed."""
    outcome = session.run(
        sh("ln -s /etc/hostname $VESSEL_OUTBOX/link; echo x > $VESSEL_OUTBOX/real")
    )
    assert [f.name for f in outcome.files] == ["real"]
    assert list((workspace / "outbox").iterdir()) == []


def test_file_tool_answers_in_the_worker(session: ServerSession, workspace: Path) -> None:
    """A file tool request is answered (by the file worker) with text and an error flag."""
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    outcome = file_tool(session, "read", {"path": "/workspace/notes.txt"}, timeout=10)
    assert not outcome.is_error
    assert "alpha" in outcome.text
    missing = file_tool(session, "read", {"path": "/workspace/none.txt"}, timeout=10)
    assert missing.is_error


async def test_arun_runs_a_call(session: ServerSession) -> None:
    """The async twin returns the same outcome without blocking the event loop."""
    outcomes = await asyncio.gather(*(session.arun(sh(f"echo {i}")) for i in range(3)))
    assert [o.output for o in outcomes] == ["0\n", "1\n", "2\n"]
    file_outcome = await afile_tool(session, "list", {"path": "/workspace"}, timeout=10)
    assert not file_outcome.is_error


async def test_cancelled_arun_kills_the_call(session: ServerSession, workspace: Path) -> None:
    """Cancelling an awaiting arun kills the call in the sandbox."""
    task = asyncio.ensure_future(session.arun(sh("echo $$ > pid; exec sleep 300", timeout=60)))
    pid_file = workspace / "pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(pid_file.read_text())
    for _ in range(100):
        if not _alive(pid):
            break
        await asyncio.sleep(0.02)
    assert not _alive(pid)
    assert session.run(sh("echo still fine")).output == "still fine\n"


def test_server_killed_mid_call_raises(session: ServerSession) -> None:
    """If the server dies during a call, the call and every later one raise SandboxError."""
    pid = session.ready_info["pid"]
    errors: list[BaseException] = []

    def call() -> None:
        try:
            session.run(sh("sleep 30", timeout=60))
        except SandboxError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert "killed by SIGKILL" in str(errors[0])
    with pytest.raises(SandboxError, match="killed by SIGKILL"):
        session.run(sh("true"))
    with pytest.raises(SandboxError):
        file_tool(session, "list", {}, timeout=5)


# Runs the server (argv after its own) with its stdout piped, copies that output on, and
# stops copying, then exits, just after the marker's first byte: the frame carrying it is
# cut short on the host's pipe, as when the path between a server and the host breaks.
CUTTER = """
import subprocess, sys
server = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
data, sent = b"", 0
while True:
    chunk = server.stdout.read1(65536)
    if not chunk:
        break
    data += chunk
    at = data.find(b"CUT-HERE")
    upto = len(data) if at < 0 else at + 1
    sys.stdout.buffer.write(data[sent:upto])
    sys.stdout.buffer.flush()
    sent = upto
    if at >= 0:
        server.kill()
        break
"""


def test_a_frame_cut_short_is_an_error_naming_it(workspace: Path) -> None:
    """The server's output ends inside a frame: the call raises SandboxError saying so, and
    never returns the output before the cut as its whole output."""
    channel = PipeChannel.spawn(
        [sys.executable, "-c", CUTTER, *server_command(sys.executable)], name="cut"
    )
    with (
        ServerSession.start(
            channel,
            Policy(),
            backend="cut",
            confine=False,
            drop_uid=None,
            drop_gid=None,
            seccomp=None,
            path_map={"/workspace": str(workspace)},
        ) as cut,
        pytest.raises(SandboxError, match="ended inside a frame"),
    ):
        cut.run(sh("echo before; printf 'CUT-HERE and after'"))


def test_closed_session_refuses_calls(session: ServerSession) -> None:
    """After close, a call raises SandboxError saying the session is closed."""
    session.close()
    session.close()
    with pytest.raises(SandboxError, match="closed"):
        session.run(sh("true"))


def test_server_that_never_starts_raises() -> None:
    """A server that exits before ready raises SandboxError with its stderr tail."""
    channel = PipeChannel.spawn(
        [sys.executable, "-c", "import sys; sys.exit('no python here')"], name="broken"
    )
    with pytest.raises(SandboxError, match="no python here"):
        ServerSession.start(
            channel,
            Policy(),
            backend="broken",
            confine=False,
            drop_uid=None,
            drop_gid=None,
            seccomp=None,
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its reaper is gone for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone between the open and the read: ESRCH, not ENOENT
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
