"""Promises: a call sees and signals only its own processes, and leaves none behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from .calls import py, py_json, run, wait_until_gone


@pytest.fixture
def host_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the host, running while the call tries to reach it."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_sees_only_its_own_processes(session, host_process):
    """/proc in a call lists only the call's own processes: not the host's, not the server."""
    result = py_json(
        session,
        """
        import json, os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        cmds = [open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace") for p in pids]
        print(json.dumps({"pids": pids, "cmds": cmds}))
        """,
    )
    # pid 1 is the call's own init (a fork of the server, hence its command line), the other
    # the call itself.
    assert len(result["pids"]) == 2
    assert result["pids"][0] == 1
    assert not any("sleep" in cmd for cmd in result["cmds"])


def test_cannot_signal_host_process(session, host_process):
    """Signalling a host process's pid from a call reaches nothing; the host process lives on."""
    result = py_json(
        session,
        f"""
        import json, os, signal
        try:
            os.kill({host_process.pid}, signal.SIGKILL)
            print(json.dumps("sent"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    assert result != "sent"
    assert host_process.poll() is None


def test_kill_everything_leaves_server_alive(session):
    """``kill(-1, SIGKILL)`` from a call ends only the call; the server answers the next one."""
    outcome = py(session, "import os, signal; os.kill(-1, signal.SIGKILL); print('survived')")
    assert "survived" not in outcome.output
    assert run(session, "echo", "still here").output.strip() == "still here"


def test_cannot_signal_the_server_by_pid(session):
    """A call signalling pid 1 and 2 (where launchers put the server) reaches only its own init."""
    outcome = py(
        session,
        """
        import os, signal
        for pid in (1, 2):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        print("done")
        """,
    )
    assert outcome.exit_code is not None
    assert run(session, "echo", "alive").output.strip() == "alive"


def test_cannot_stop_kill_or_read_its_own_init(session):
    """The call's pid 1 shares the call's uid, yet ignores the call's signals and hides in /proc."""
    result = py_json(
        session,
        """
        import json, os, signal, time
        for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            os.kill(1, sig)
        time.sleep(0.2)
        state = open("/proc/1/stat").read().rsplit(")", 1)[1].split()[0]
        denied = []
        for name in ("environ", "mem", "maps"):
            try:
                open(f"/proc/1/{name}", "rb").read(1)
            except PermissionError:
                denied.append(name)
        # The directory may list (as an ordinary user the call's host uid owns it), but not
        # one descriptor in it may be opened or named.
        try:
            fds = os.listdir("/proc/1/fd")
        except PermissionError:
            fds = []
        reached = []
        for fd in fds:
            for reach in (os.readlink, lambda p: os.close(os.open(p, os.O_WRONLY))):
                try:
                    reach(f"/proc/1/fd/{fd}")
                    reached.append(fd)
                except PermissionError:
                    pass
        if not reached:
            denied.append("fd")
        print(json.dumps({"state": state, "denied": denied}))
        """,
    )
    # Still sleeping in wait(), neither stopped (T) nor gone; its memory and descriptors closed.
    assert result["state"] == "S"
    assert result["denied"] == ["environ", "mem", "maps", "fd"]
    assert run(session, "echo", "next").output.strip() == "next"


def test_background_process_is_gone_after_call(session):
    """A process a call leaves running in the background is killed when the call returns."""
    marker = f"{os.getpid() % 1000 + 100}.{os.urandom(3).hex().translate(str.maketrans('abcdef', '123456'))}"
    outcome = run(session, "/bin/sh", "-c", f"sleep {marker} & echo started")
    assert outcome.output.strip() == "started"
    assert wait_until_gone(f"sleep {marker}") == []


def test_double_forked_daemon_is_gone_after_call(session):
    """A double-forked daemon (setsid refused, re-parented) does not outlive its call."""
    marker = f"{os.getpid() % 1000 + 200}.{int(time.time() * 1000) % 100000}"
    outcome = py(
        session,
        f"""
        import os
        if os.fork() == 0:
            try:
                os.setsid()
            except OSError:
                pass
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{marker}"])
            os._exit(0)
        os.wait()
        print("parent done")
        """,
    )
    assert "parent done" in outcome.output
    assert wait_until_gone(f"sleep {marker}") == []


def test_setsid_and_setpgid_refused(session):
    """``setsid`` and ``setpgid`` fail with EPERM inside a call."""
    result = py_json(
        session,
        """
        import json, os
        out = {}
        for name, fn in (("setsid", os.setsid), ("setpgid", lambda: os.setpgid(0, 0))):
            try:
                fn()
                out[name] = "allowed"
            except OSError as exc:
                out[name] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result == {"setsid": 1, "setpgid": 1}


def test_timeout_kills_the_whole_tree(session):
    """A call past its timeout is killed with every process it started, and says so."""
    marker = f"{os.getpid() % 1000 + 300}.{int(time.time() * 1000) % 100000}"
    outcome = run(
        session, "/bin/sh", "-c", f"sleep {marker} & sleep {marker}; echo never", timeout=1.0
    )
    assert outcome.timed_out
    assert "never" not in outcome.output
    assert wait_until_gone(f"sleep {marker}") == []


def test_host_signals_do_not_reach_a_call_process_group(session):
    """Whatever a call does with signals, the host's own process group is untouched."""
    outcome = py(session, "import os, signal; os.killpg(0, signal.SIGTERM)")
    assert outcome.exit_code is not None
    # We are still running: the call's process group is not ours.
    assert os.getpgrp() == os.getpgid(0)
    assert signal.getsignal(signal.SIGTERM) is not None
