"""As root, the kernel's memory group is the turn's hard bound: what it stops says memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astralvessel.results import command_output, with_memory_notes
from astralvessel.sandbox import ExecRequest, Limits, Policy, RunRequest, SandboxSession
from astralvessel.sandbox._cgroup import memory_mount, turn_cgroup
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._hostinfo import collect_host_facts

MIB = 1 << 20
#: The watch's limit stays far above what the calls hold, so only the group can stop them.
LIMITS = Limits(disk_mb=16, memory_mb=512, processes=48, open_files=256)
#: What a call allocates, in 8 MiB steps: under memory_mb, over the group's lowered bound.
ALLOCATE_MB = 160
HOLD = f"""
import time
held = []
for _ in range({ALLOCATE_MB} // 8):
    held.append(bytearray(8 << 20))
    time.sleep(0.01)
print("allocated all")
"""


def _memory_group(session: SandboxSession, backend: str) -> Path:
    """The host folder of the turn's memory group, found from a host pid of its sandbox."""
    mount = memory_mount(collect_host_facts())
    assert mount is not None, "these tests need root on cgroup v1 with memory mounted"
    channel = session.channel
    if backend == "docker":
        container = channel.container_id  # type: ignore[attr-defined]
        pid = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Pid}}", container],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    else:
        pid = str(channel.process.pid)  # type: ignore[attr-defined]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path(mount + path)
    raise AssertionError(f"pid {pid} has no memory group")


def _run(session: SandboxSession, *argv: str) -> str:
    outcome = session.run(RunRequest(argv=argv, timeout=60.0, output_chars=100_000))
    # The output as the model reads it: with the notes on what stopped the call.
    return f"{outcome.exit_code}|{command_output(outcome)}"


def _lower_the_bound(session: SandboxSession, backend: str) -> int:
    """Lower the turn's memory group below what ``HOLD`` allocates; the new bound in MiB.

    Lowered by hand: the watch's limit (memory_mb) is far above what the call holds, and
    the group's configured bound too, so the note must state the bound the kernel applied.
    """
    group = _memory_group(session, backend)
    usage = int((group / "memory.usage_in_bytes").read_text())
    bound = usage + ALLOCATE_MB // 2 * MIB
    (group / "memory.limit_in_bytes").write_text(str(bound))
    # The kernel rounds a limit down to whole pages.
    return int((group / "memory.limit_in_bytes").read_text()) >> 20


@pytest.mark.parametrize("backend", ["bubblewrap", "nsjail", "docker"])
def test_a_call_the_kernel_stops_for_memory_says_so(backend: str) -> None:
    """A call the memory group's OOM killer stops gets a result naming memory; the turn goes on."""
    session = get_backend(backend).start(Policy(limits=LIMITS))
    try:
        assert _run(session, "/bin/echo", "warm") == "0|warm\n"
        bound_mb = _lower_the_bound(session, backend)
        stopped = _run(session, "/usr/bin/python3", "-c", HOLD)
        code, _, output = stopped.partition("|")
        # Killed: the command (SIGKILL's -9), or its init with it (no exit code at all).
        assert code in {"-9", "None"}, stopped
        assert "allocated all" not in output
        assert "[memory limit: the kernel stopped" in output, output
        assert "while this call ran" in output
        assert f"the turn held its whole {bound_mb} MiB (" in output, output
        # The server was not the one stopped: the next call runs in the same sandbox.
        assert session.alive()
        assert _run(session, "/bin/echo", "after") == "0|after\n"
    finally:
        session.close()


@pytest.mark.parametrize("backend", ["bubblewrap", "nsjail", "docker"])
def test_an_exec_the_kernel_stops_for_memory_says_so(backend: str) -> None:
    """An exec the memory group's OOM killer stops ends its stderr with the same note."""
    session = get_backend(backend).start(Policy(limits=LIMITS))
    try:
        assert _run(session, "/bin/echo", "warm") == "0|warm\n"
        bound_mb = _lower_the_bound(session, backend)
        request = ExecRequest(
            argv=("/usr/bin/python3", "-c", HOLD), timeout=60.0, output_bytes=100_000
        )
        stopped = session.exec(request)
        assert stopped.returncode == -9, stopped
        assert b"allocated all" not in stopped.stdout
        # The stderr the turn returns: the session's, then the notes on what stopped it.
        stderr = with_memory_notes(stopped).stderr.decode()
        assert "[memory limit: the kernel stopped" in stderr, stderr
        assert f"the turn held its whole {bound_mb} MiB (" in stderr, stderr
        assert session.alive()
        assert _run(session, "/bin/echo", "after") == "0|after\n"
    finally:
        session.close()


def test_a_sandbox_the_kernel_kills_for_memory_says_so() -> None:
    """A sandbox process the memory group kills is described as killed for memory."""
    mount = memory_mount(collect_host_facts())
    assert mount is not None, "this test needs root on cgroup v1 with memory mounted"
    group = turn_cgroup({"memory": mount}, Limits(memory_mb=8, disk_mb=8))
    grow = "held = []\nwhile True: held.append(bytearray(8 << 20))"
    channel = PipeChannel.spawn(
        group.wrap([sys.executable, "-c", grow]),
        name="test",
        cleanup=group.remove,
        explain=group.memory_note,
    )
    try:
        channel.process.wait(timeout=60)
        described = channel.describe_exit()
    finally:
        channel.close()
    assert "was killed by SIGKILL, killed for using more memory than its limit" in described
    assert "the kernel stopped 1 process of the turn when it held its whole 144 MiB" in described
