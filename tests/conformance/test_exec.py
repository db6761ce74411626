"""``Turn.exec``: a host's command, confined like a tool call, with its streams apart."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from astralvessel import ExecResult, Turn, TurnClosedError
from astralvessel._executor import _exec as exec_module

from .calls import PYTHON, barrier, host_processes_with, wait_until_gone

SHELL = "/bin/sh"


def test_stdout_and_stderr_come_back_apart(turn: Turn):
    """stdout and stderr arrive as two byte strings, with the exit code."""
    result = turn.exec([SHELL, "-c", "echo out; echo err >&2; exit 3"])
    assert isinstance(result, ExecResult)
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not result.timed_out
    assert not result.truncated


def test_binary_bytes_in_and_out(turn: Turn):
    """Every byte value passes through stdin and stdout unchanged, NULs and invalid UTF-8 too."""
    data = bytes(range(256)) * 64 + os.urandom(4096)
    result = turn.exec(["cat"], input=data)
    assert result.returncode == 0
    assert result.stdout == data


def test_text_input_is_utf8(turn: Turn):
    """``input`` given as text reaches the command as UTF-8."""
    result = turn.exec(["cat"], input="héron → otter\n")
    assert result.stdout == "héron → otter\n".encode()


def test_large_argv_reaches_the_command(turn: Turn):
    """Sixteen 64 KiB arguments (1 MiB of argv) reach the command whole."""
    chunk = "x" * (64 * 1024)
    result = turn.exec(["printf", "%s", *([chunk] * 16)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == chunk.encode() * 16


def test_cwd_absolute_relative_and_default(turn: Turn):
    """cwd defaults to the workdir; a relative cwd is taken from the workdir, an absolute as is."""
    assert turn.exec(["pwd"]).stdout == b"/data\n"
    assert turn.exec(["pwd"], cwd="/workspace").stdout == b"/workspace\n"
    assert turn.exec(["mkdir", "-p", "/workspace/sub"]).returncode == 0
    assert turn.exec(["pwd"], cwd="../workspace/sub").stdout == b"/workspace/sub\n"


def test_missing_cwd_or_command_is_a_failed_result(turn: Turn):
    """A cwd that does not exist or a command not found is the command's failure, not an error."""
    missing_cwd = turn.exec(["pwd"], cwd="/workspace/nowhere")
    assert missing_cwd.returncode == 126
    assert b"/workspace/nowhere" in missing_cwd.stderr
    assert turn.exec(["no-such-command-here"]).returncode == 127


def test_env_is_set_over_the_clean_environment(turn: Turn):
    """Host variables join the clean environment; nothing of the host's own leaks in."""
    result = turn.exec(["env"], env={"GREETING": "hello world", "LANG": "C"})
    names = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert names["GREETING"] == "hello world"
    assert names["LANG"] == "C"
    assert set(names) == {"PATH", "LANG", "HOME", "TMPDIR", "VESSEL_OUTBOX", "GREETING"}


def test_exec_is_confined_like_a_call(turn: Turn):
    """An exec'd process holds no capability, has no_new_privs and runs under the filter."""
    status = turn.exec(["cat", "/proc/self/status"]).stdout.decode()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"


def test_timeout_kills_the_whole_tree(turn: Turn):
    """Past its timeout a command and everything it started are killed; the result says so."""
    marker = f"exec-timeout-{os.getpid()}-{os.urandom(3).hex()}"
    sleeper = f"{PYTHON} -c 'import time; time.sleep(1000)' {marker}"
    result = turn.exec([SHELL, "-c", f"{sleeper} & {sleeper}; echo never", marker], timeout=1)
    assert result.timed_out
    assert result.returncode == -9
    assert b"never" not in result.stdout
    assert wait_until_gone(marker) == []


def test_an_exec_leaves_nothing_running(turn: Turn):
    """A daemon an exec started in the background is gone when the exec returns."""
    marker = f"exec-daemon-{os.getpid()}-{os.urandom(3).hex()}"
    # The daemon says it is up before the exec returns, so the test sees it started.
    daemon = (
        f"{PYTHON} -c 'import sys, time; open(sys.argv[1], \"w\").close(); time.sleep(1000)' "
        f"/workspace/up {marker}"
    )
    wait = "while [ ! -e /workspace/up ]; do sleep 0.05; done"
    result = turn.exec([SHELL, "-c", f"({daemon} &) ; {wait}; echo started"], timeout=20)
    assert result.stdout == b"started\n"
    assert wait_until_gone(marker) == []


def test_each_stream_is_cut_at_its_bound(turn: Turn):
    """Past the per-stream bound output is dropped, each stream on its own, and the result says so."""
    over = exec_module.OUTPUT_BYTES + 4096
    result = turn.exec(
        [SHELL, "-c", f"head -c {over} /dev/zero; head -c 5 /dev/zero | tr '\\0' e >&2"]
    )
    assert result.returncode == 0
    assert result.truncated
    assert len(result.stdout) == exec_module.OUTPUT_BYTES
    assert result.stderr == b"eeeee"


def test_sixteen_execs_run_at_once(turn: Turn):
    """Sixteen execs of one turn run concurrently: all sixteen meet at a rendezvous.

    Execs run one at a time never bring a second check-in, so the first gives up
    3 s after its own (the rest leave at once): the test fails in seconds there.
    """
    assert turn.exec(["mkdir", "-p", "/workspace/meet"]).returncode == 0

    async def all_at_once() -> list[ExecResult]:
        return await asyncio.gather(
            *(
                turn.aexec([SHELL, "-c", barrier("/workspace/meet", str(n), 16, stall_s=3)])
                for n in range(16)
            )
        )

    results = asyncio.run(all_at_once())
    assert [r.stdout for r in results] == [b"met\n"] * 16


def _sleeper_running(marker: str) -> None:
    """Wait until a host process carries ``marker``: the execs are in flight (or queued)."""
    deadline = time.monotonic() + 30
    while not host_processes_with(marker):
        assert time.monotonic() < deadline, "no exec ever started"
        time.sleep(0.05)


def test_closing_the_turn_under_running_execs_is_turn_closed(turn: Turn):
    """Execs in other threads when the turn closes raise TurnClosedError, and nothing stays."""
    marker = f"exec-closed-{os.getpid()}-{os.urandom(3).hex()}"
    outcomes: list[BaseException | ExecResult] = []

    def one() -> None:
        try:
            outcomes.append(turn.exec([SHELL, "-c", f"sleep 1000; : {marker}", marker]))
        except BaseException as error:  # the test reports whatever it was
            outcomes.append(error)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    _sleeper_running(marker)
    turn.close()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert [type(o) for o in outcomes] == [TurnClosedError] * 4, outcomes
    assert wait_until_gone(marker) == []


def test_closing_the_turn_under_running_aexecs_is_turn_closed(turn: Turn):
    """Awaited execs when another task closes the turn raise TurnClosedError, and nothing stays."""
    marker = f"aexec-closed-{os.getpid()}-{os.urandom(3).hex()}"

    async def close_when_running() -> None:
        await asyncio.to_thread(_sleeper_running, marker)
        await turn.aclose()

    async def main() -> list[BaseException | ExecResult]:
        argv = [SHELL, "-c", f"sleep 1000; : {marker}", marker]
        closing = asyncio.ensure_future(close_when_running())
        outcomes = await asyncio.gather(
            *(turn.aexec(argv) for _ in range(4)), return_exceptions=True
        )
        await closing
        return outcomes

    outcomes = asyncio.run(main())
    assert [type(o) for o in outcomes] == [TurnClosedError] * 4, outcomes
    assert wait_until_gone(marker) == []
