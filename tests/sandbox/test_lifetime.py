"""A turn's sandbox lives as long as the turn, whichever thread made it, and never past the host."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from astralvessel.sandbox import Policy, SandboxSession
from astralvessel.sandbox._base import RunRequest
from astralvessel.sandbox._discovery import get_backend

BACKENDS = ["bubblewrap", "nsjail"]


def _echo(text: str) -> RunRequest:
    return RunRequest(argv=["/bin/echo", text], timeout=20.0, output_chars=1000)


@pytest.mark.parametrize("name", BACKENDS)
def test_turn_outlives_the_thread_that_opened_it(name: str) -> None:
    """A sandbox started on a thread that then exits keeps answering calls from other threads."""

    def open_turn() -> SandboxSession:
        session = get_backend(name).start(Policy())
        assert session.run(_echo("first")).output == "first\n"
        return session

    # A fresh pool per step: each step runs on a thread that is gone when the step returns.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        session = pool.submit(open_turn).result()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert pool.submit(session.run, _echo("second")).result().output == "second\n"
        assert session.run(_echo("third")).output == "third\n"
    finally:
        session.close()


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (names one process, even if the pid is reused later)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _descendants(root: int) -> dict[int, str]:
    """Every process below ``root``, each with its start time."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None:
            found[pid] = started
        todo += children.get(pid, [])
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


HOST = textwrap.dedent(
    """
    import sys, threading, time
    from astralvessel.sandbox import Policy
    from astralvessel.sandbox._base import RunRequest
    from astralvessel.sandbox._discovery import get_backend

    def open_and_call():
        session = get_backend(sys.argv[1]).start(Policy())
        session.run(RunRequest(argv=["/bin/sleep", "300"], timeout=600.0, output_chars=100))

    # The turn is opened and called from a thread, as a framework's worker pool would.
    threading.Thread(target=open_and_call, daemon=True).start()
    time.sleep(600)
    """
)


@pytest.mark.parametrize("name", BACKENDS)
def test_no_sandbox_outlives_a_killed_host(name: str) -> None:
    """SIGKILL of the host process takes its sandbox and the call running in it."""
    host = subprocess.Popen([sys.executable, "-c", HOST, name])
    try:
        deadline = time.monotonic() + 60
        sandbox: dict[int, str] = {}
        while time.monotonic() < deadline:
            sandbox = _descendants(host.pid)
            if any(_comm(pid) == "sleep" for pid in sandbox):
                break
            time.sleep(0.1)
        assert any(_comm(pid) == "sleep" for pid in sandbox), "the call never started"
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = {pid for pid, started in sandbox.items() if _start_time(pid) == started}
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"still running after the host died: {sorted(map(_comm, left))}"
