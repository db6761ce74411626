"""The field: conditions the suite tests one at a time, here together, on every backend.

A turn opened from a thread that has since exited, a turn closed from another
thread while a call runs, many turns at once from a thread pool each mixing
tool calls, ``Turn.exec``, ``Turn.start`` and the file primitives, and hostile
arguments in every host entry point of a turn. The host's mistakes raise
``UsageError``; nothing leaves the turn broken or a process behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

import astralvessel as av
from astralvessel.errors import TurnClosedError, UsageError

#: Turns the pool runs at once: enough to overlap every kind of work on two cores.
POOL_TURNS = 16

#: Each hostile argument, by the entry point it is given to: each is the host's mistake.
HOSTILE: dict[str, Callable[[av.Turn], object]] = {
    "exec: NUL in argv": lambda t: t.exec(["echo", "a\0b"]),
    "exec: lone surrogate in argv": lambda t: t.exec(["echo", "\ud800"]),
    "exec: 2 MB argv": lambda t: t.exec(["echo", "x" * (2 << 20)]),
    "exec: lone surrogate in input": lambda t: t.exec(["cat"], input="a\ud800"),
    "exec: lone surrogate in env": lambda t: t.exec(["true"], env={"K": "\udcff"}),
    "exec: NUL in cwd": lambda t: t.exec(["true"], cwd="/work\0space"),
    "exec: deep list as argv": lambda t: t.exec([["echo"] * 2] * 2),  # type: ignore[list-item]
    "start: NUL in argv": lambda t: t.start(["echo", "a\0b"]),
    "start: 2 MB argv": lambda t: t.start(["echo", "x" * (2 << 20)]),
    "start: lone surrogate in input": lambda t: t.start(["cat"], input="\udc80"),
    "write_file: lone surrogate in data": lambda t: t.write_file("/workspace/s", "a\ud800"),
    "write_file: NUL in path": lambda t: t.write_file("/workspace/a\0b", b"x"),
    "write_file: lone surrogate in path": lambda t: t.write_file("/workspace/\ud800", b"x"),
    "read_file: NUL in path": lambda t: t.read_file("a\0b"),
    "list_dir: lone surrogate in path": lambda t: t.list_dir("/\ud800"),
}


def _alive(turn: av.Turn) -> None:
    result = turn.call("bash", {"command": "echo still here"})
    assert not result.is_error, result.text
    assert turn.exec(["echo", "ok"]).stdout == b"ok\n"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_host_arguments_raise_usage_error(turn: av.Turn, name: str) -> None:
    """Each hostile argument to exec, start and the file primitives raises UsageError, and
    the turn works on."""
    with pytest.raises(UsageError):
        HOSTILE[name](turn)
    _alive(turn)


def test_a_turn_from_a_thread_that_exited_works_and_closes(executor: av.Executor) -> None:
    """A turn opened in a thread that has exited serves calls, execs, detached processes and
    files from another thread, and closes cleanly."""
    opened: list[av.Turn] = []
    opener = threading.Thread(target=lambda: opened.append(executor.turn()))
    opener.start()
    opener.join()
    [turn] = opened
    try:
        _alive(turn)
        turn.write_file("/workspace/from-thread", b"kept")
        assert turn.read_file("/workspace/from-thread") == b"kept"
        process = turn.start(["sh", "-c", "echo detached"])
        assert process.result(timeout=30).stdout == b"detached\n"
    finally:
        turn.close()
    with pytest.raises(TurnClosedError):
        turn.exec(["true"])


def test_closing_from_another_thread_ends_a_running_exec(executor: av.Executor) -> None:
    """A turn closed from another thread while an exec sleeps ends it with TurnClosedError,
    long before the command would have finished."""
    turn = executor.turn()
    closer = threading.Timer(1.0, turn.close)
    closer.start()
    started = time.monotonic()
    try:
        with pytest.raises(TurnClosedError):
            turn.exec(["sleep", "120"], timeout=120)
    finally:
        closer.join()
    # Generous: only that the close did not wait for the command's two minutes.
    assert time.monotonic() - started < 60


def test_closing_from_another_thread_ends_a_running_tool_call(executor: av.Executor) -> None:
    """A turn closed from another thread while a bash call sleeps returns an error result or
    raises TurnClosedError, and does not wait for the command."""
    turn = executor.turn()
    closer = threading.Timer(1.0, turn.close)
    closer.start()
    started = time.monotonic()
    try:
        result = turn.call("bash", {"command": "sleep 50"})
        assert result.is_error, result.text
    except TurnClosedError:
        pass
    finally:
        closer.join()
    assert time.monotonic() - started < 45


def _mixed_work(executor: av.Executor, number: int) -> str:
    """One turn's mixed work: a tool call, an exec, a detached process and a file round trip."""
    with executor.turn() as turn:
        result = turn.call("bash", {"command": f"echo call-{number}"})
        assert not result.is_error, result.text
        assert result.text.startswith(f"call-{number}"), result.text
        echoed = turn.exec(["sh", "-c", f"echo exec-{number}"])
        assert echoed.stdout == f"exec-{number}\n".encode(), echoed
        process = turn.start(["sh", "-c", f"echo start-{number}"])
        turn.write_file(f"/workspace/f{number}", f"file-{number}")
        assert turn.read_file(f"/workspace/f{number}") == f"file-{number}".encode()
        assert (f"f{number}", "file") in turn.list_dir("/workspace")
        assert process.result(timeout=60).stdout == f"start-{number}\n".encode()
        with pytest.raises(UsageError):
            turn.exec(["echo", "\0"])
        return turn.exec(["cat", f"/workspace/f{number}"]).stdout.decode()


def test_many_turns_at_once_from_a_thread_pool(executor: av.Executor) -> None:
    """Sixteen turns at once from a thread pool, each mixing tool calls, execs, detached
    processes, files and a hostile argument, all succeed and see only their own files."""
    with ThreadPoolExecutor(max_workers=POOL_TURNS) as pool:
        outcomes = list(pool.map(lambda n: _mixed_work(executor, n), range(POOL_TURNS)))
    assert outcomes == [f"file-{n}" for n in range(POOL_TURNS)]


def test_a_detached_processs_whole_log_comes_before_its_exit(turn: av.Turn) -> None:
    """Detached processes that write their log and exit at once: each result holds the whole
    log, never a log cut by the exit arriving first."""
    for _ in range(4):
        processes = [
            turn.start(["sh", "-c", f"head -c 40000 /dev/zero | tr '\\0' '{n}'"]) for n in range(8)
        ]
        for n, process in enumerate(processes):
            assert process.result(timeout=60).stdout == str(n).encode() * 40000
