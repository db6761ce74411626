"""``Turn.start``: a detached process outlives its call, stays confined and dies with its turn."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import pytest

from astralvessel import DetachedProcess, Executor, Registry, Turn, UsageError
from astralvessel._executor import _exec as exec_module
from astralvessel.sandbox import Sandbox

from .calls import PYTHON, host_processes_with, wait_until_gone
from .conftest import TEST_LIMITS

SHELL = "/bin/sh"


def _marker() -> str:
    return f"detached-{os.getpid()}-{os.urandom(4).hex()}"


def _sleeper(marker: str) -> list[str]:
    """A Python process that sleeps, with ``marker`` on its command line for the host to find."""
    return [PYTHON, "-c", "import time; time.sleep(1000)", marker]


def _daemon_script(marker: str, then: str = "exit 0") -> str:
    """A shell line that forks a daemon (marked), then runs ``then``.

    The daemon says it is up by a file, so a test never mistakes a process
    that is still starting (or dying) for one that lives on.
    """
    daemon = f"import time; open('/workspace/{marker}', 'w').close(); time.sleep(1000)"
    return f'{PYTHON} -c "{daemon}" {marker} & {then}'


def _daemon_up(turn: Turn, marker: str) -> list[int]:
    """Wait until the daemon marked ``marker`` wrote its file; return its host pids."""
    deadline = time.monotonic() + 30
    while turn.exec(["test", "-e", f"/workspace/{marker}"]).returncode != 0:
        assert time.monotonic() < deadline, "the daemon never came up"
        time.sleep(0.05)
    return host_processes_with(marker)


def _wait_for(marker: str, seconds: float = 20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while not (found := host_processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_detached_process_returns_at_once_and_reports_its_exit(turn: Turn):
    """``start`` returns a handle while the command runs; its result has the exit code and log."""
    process = turn.start(
        [SHELL, "-c", "read line; echo out $line; echo err >&2; exit 3"], input="go\n"
    )
    assert isinstance(process, DetachedProcess)
    result = process.result(timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out go\nerr\n", b"")
    assert process.poll() == 3
    assert process.done()


def test_detached_process_outlives_the_call_that_started_it(turn: Turn):
    """A detached process keeps running across later calls, which see its work in the workspace."""
    process = turn.start(
        [SHELL, "-c", "i=0; while :; do i=$((i+1)); echo $i > /workspace/beat; sleep 0.05; done"]
    )
    assert turn.exec(["true"]).returncode == 0
    seen = set()
    deadline = time.monotonic() + 30
    while len(seen) < 3 and time.monotonic() < deadline:
        beat = turn.exec([SHELL, "-c", "cat /workspace/beat 2>/dev/null"]).stdout.strip()
        if beat:
            seen.add(beat)
    assert len(seen) >= 3, seen
    assert process.poll() is None
    process.kill()
    assert process.result(timeout=30).returncode == -9


def test_a_forked_daemon_lives_on_confined(turn: Turn):
    """A server that forks a daemon and exits returns 0, and the daemon lives on, still confined."""
    marker = _marker()
    result = turn.start([SHELL, "-c", _daemon_script(marker)]).result(timeout=30)
    assert result.returncode == 0, result.stdout
    pids = _daemon_up(turn, marker)
    assert pids, "the daemon did not survive its parent's exit"
    assert turn.exec(["true"]).returncode == 0
    assert host_processes_with(marker) == pids, "the daemon did not outlive a later call"
    status = _status(pids[0])
    # Not the host's root, no capability, and in a PID namespace of its own (NSpid has two ids).
    assert status["Uid"].split()[0] != "0"
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapBnd"], 16) == 0
    assert len(status["NSpid"].split()) >= 2
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"


def test_detached_processes_die_with_their_turn(backend: Sandbox, agent_dir: Path):
    """Closing the turn kills every detached process and every daemon they forked."""
    running, daemon = _marker(), _marker()
    with Executor(Registry(), sandbox=backend) as executor:
        turn = executor.turn()
        turn.start(_sleeper(running))
        turn.start([SHELL, "-c", _daemon_script(daemon)]).result(timeout=30)
        assert _wait_for(running)
        assert _daemon_up(turn, daemon)
        turn.close()
    assert wait_until_gone(running, 20) == []
    assert wait_until_gone(daemon, 20) == []


def test_kill_takes_the_whole_tree(turn: Turn):
    """``kill`` ends the command and what it forked, a daemon re-parented to init too."""
    marker = _marker()
    process = turn.start([SHELL, "-c", _daemon_script(marker, "sleep 1000")])
    assert _daemon_up(turn, marker)
    process.kill()
    assert process.result(timeout=30).returncode == -9
    assert wait_until_gone(marker, 20) == []
    process.kill()  # idempotent


def test_detached_timeout_kills_the_whole_tree(turn: Turn):
    """A ``timeout`` bounds the process and its daemons together: past it, all are killed."""
    marker = _marker()
    # Long enough for the daemon to come up and be seen on a loaded host, and no longer:
    # the test waits it out whole.
    process = turn.start([SHELL, "-c", _daemon_script(marker)], timeout=4.0)
    assert process.result(timeout=30).returncode == 0
    assert _daemon_up(turn, marker)
    assert wait_until_gone(marker, 60) == []


def test_the_turn_holds_a_bounded_number(turn: Turn):
    """Past the bound one more is refused; a daemon keeps its slot; a freed slot can be reused."""
    bound = exec_module.DETACHED_PER_TURN
    marker = _marker()
    # One slot held by a daemon whose own command has exited.
    turn.start([SHELL, "-c", _daemon_script(marker)]).result(timeout=30)
    assert _daemon_up(turn, marker)
    held = [turn.start(["sleep", "1000"]) for _ in range(bound - 1)]
    with pytest.raises(UsageError, match=f"already holds {bound}"):
        turn.start(["true"])
    held[0].kill()
    held[0].result(timeout=30)
    # The namespace's end reaches the server a moment after the kill's answer.
    deadline = time.monotonic() + 30
    while True:
        try:
            again = turn.start(["true"])
            break
        except UsageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert again.result(timeout=30).returncode == 0


def test_a_process_that_left_nothing_running_frees_its_slot_by_its_result(turn: Turn):
    """Once the result of a command that left nothing running is in, its slot is free: a
    full turn whose commands all exit at once starts them all again, never refused.

    A chatty process keeps the server busy pumping its log, so the ends of the others
    often reach it outside the status pipe's handler (the memory watch reads every
    call's status while calls run): an end read there must free the slot all the same.
    """
    chatty = turn.start(["cat", "/dev/zero"])
    others = exec_module.DETACHED_PER_TURN - 1
    for round_ in range(10):
        go = f"/workspace/go-{round_}"
        waiting = [SHELL, "-c", f"until [ -e {go} ]; do sleep 0.01; done"]
        processes = [turn.start(waiting) for _ in range(others)]
        turn.write_file(go, b"")
        assert [p.result(timeout=60).returncode for p in processes] == [0] * others
    chatty.kill()
    assert chatty.result(timeout=30).returncode == -9


def test_limits_hold_for_a_detached_process(turn: Turn):
    """The turn's memory and process limits bound a detached process as they bound a call."""
    memory = turn.start([PYTHON, "-c", "b = bytearray(1 << 30); print('allocated')"])
    result = memory.result(timeout=60)
    assert result.returncode != 0
    assert b"allocated" not in result.stdout
    fork = textwrap.dedent(
        """
        import os, time
        n = 0
        try:
            while n < 500:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
        """
    )
    forks = turn.start([PYTHON, "-c", fork])
    counted = forks.result(timeout=60)
    assert int(counted.stdout.split()[-1]) < TEST_LIMITS.processes
    forks.kill()


def test_memory_watch_stops_a_detached_process(backend: Sandbox):
    """Children of a detached process, together over the turn's memory, are stopped by the watch."""
    # A large disk limit puts any memory cgroup (memory + disk + 128 MiB) far above what the
    # children hold, so only the turn-wide memory watch itself can stop them.
    limits = attrs.evolve(TEST_LIMITS, disk_mb=512)
    each = limits.memory_mb * 3 // 10  # five children: together 1.5 times the limit
    code = textwrap.dedent(
        f"""
        import os, time
        for _ in range(5):
            if os.fork() == 0:
                held = [bytearray(8 << 20) for _ in range({each} // 8)]
                time.sleep(60)
                os._exit(0)
        for _ in range(5):
            os.wait()
        print("every child ended on its own")
        """
    )
    executor = Executor(Registry(), sandbox=backend, limits=limits)
    with executor, executor.turn() as turn:
        result = turn.start([PYTHON, "-c", code]).result(timeout=120)
        assert result.returncode == -9
        assert not result.timed_out
        assert b"every child ended on its own" not in result.stdout
        # Its stderr (else empty: the log is stdout) says why, as an exec's does.
        assert result.stderr.startswith(b"[memory limit: the turn's calls held "), result.stderr
        assert f"more than the {limits.memory_mb} MiB limit".encode() in result.stderr
        # The turn goes on.
        assert turn.exec(["true"]).returncode == 0


def test_log_is_bounded(turn: Turn):
    """A detached process's log keeps its first LOG_BYTES; the rest is dropped and said so."""
    result = turn.start([SHELL, "-c", "head -c 1000000 /dev/zero | tr '\\0' x"]).result(timeout=60)
    assert result.returncode == 0
    assert result.stdout == b"x" * exec_module.LOG_BYTES
    assert result.truncated


def test_missing_command_is_a_failed_result(turn: Turn):
    """A command that does not exist is a result with exit code 127, not an error."""
    result = turn.start(["no-such-command-here"]).result(timeout=30)
    assert result.returncode == 127


@pytest.mark.parametrize(
    "argv",
    [[], "sleep 1", ["sleep", "1\0"], ["sleep", 1], ["x" * (exec_module.ARGV_BYTES + 1)]],
    ids=["empty", "string", "nul", "not-a-string", "past-arg-max"],
)
def test_hostile_argv_is_the_hosts_error(turn: Turn, argv: object):
    """An argv that is not a list of strings, holds a NUL or passes ARG_MAX raises ``UsageError``."""
    with pytest.raises(UsageError):
        turn.start(argv)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "1", True])
def test_bad_timeout_is_the_hosts_error(turn: Turn, timeout: object):
    """A timeout that is not a positive finite number of seconds raises ``UsageError``."""
    with pytest.raises(UsageError):
        turn.start(["true"], timeout=timeout)  # type: ignore[arg-type]


def test_async_start_and_result(turn: Turn):
    """``astart`` and ``aresult`` are the async twins; a timed-out wait leaves the process running."""

    async def main() -> tuple[int, int | None]:
        process = await turn.astart(["sleep", "1000"])
        with pytest.raises(TimeoutError):
            await process.aresult(timeout=0.2)
        alive = process.poll()
        process.kill()
        return (await process.aresult(timeout=30)).returncode, alive

    assert asyncio.run(main()) == (-9, None)


HOST = textwrap.dedent(
    """
    import sys, time
    from astralvessel import Executor, Registry
    turn = Executor(Registry(), sandbox=sys.argv[1]).turn()
    turn.start([sys.argv[2], "-c", "import time; time.sleep(1000)", sys.argv[3]])
    print("started", flush=True)
    time.sleep(600)
    """
)


def test_no_detached_process_outlives_a_killed_host(backend: Sandbox):
    """SIGKILL of the host process takes its detached processes with it."""
    marker = _marker()
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, backend.name, PYTHON, marker], stdout=subprocess.PIPE
    )
    try:
        assert host.stdout is not None
        assert host.stdout.readline() == b"started\n"
        assert _wait_for(marker)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
        if host.stdout is not None:
            host.stdout.close()
    assert wait_until_gone(marker, 60) == []
