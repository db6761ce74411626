"""The sync and async faces of every host API give the same results and raise the same errors.

Each pair (``call``/``acall``, ``exec``/``aexec``, ``start``/``astart`` with a detached
process's ``result``/``aresult``, the file primitives, ``snapshot``/``asnapshot``,
``fork``/``afork``, ``close``/``aclose``) runs the same
cases, good arguments and bad, on a turn that is open, closed, or whose sandbox died, on a
real bubblewrap sandbox; only the face differs.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from astralvessel import (
    ExecResult,
    Executor,
    Registry,
    SandboxError,
    ToolResult,
    Turn,
    TurnSnapshot,
)
from astralvessel.sandbox import Mount, Sandbox

from ..conformance.calls import host_processes_with
from .test_executor import kill_server

Sync = Callable[..., Any]
Async = Callable[..., Awaitable[Any]]


async def _astart(turn: Turn, *args: Any, **kwargs: Any) -> ExecResult:
    return await (await turn.astart(*args, **kwargs)).aresult(timeout=30)


def _fork(turn: Turn, n: int) -> list[bytes]:
    """What each of ``n`` forks reads of the file the cases wrote, each fork then closed."""
    forks = turn.fork(n)
    try:
        return [fork.read_file("notes/a.txt") for fork in forks]
    finally:
        for fork in forks:
            fork.close()


async def _afork(turn: Turn, n: int) -> list[bytes]:
    forks = await turn.afork(n)
    try:
        return [await fork.aread_file("notes/a.txt") for fork in forks]
    finally:
        for fork in forks:
            await fork.aclose()


#: Each host API's two faces, each called as ``face(turn, *args, **kwargs)``.
FACES: dict[str, tuple[Sync, Async]] = {
    "call": (Turn.call, Turn.acall),
    "exec": (Turn.exec, Turn.aexec),
    "start": (lambda turn, *a, **k: turn.start(*a, **k).result(timeout=30), _astart),
    "read_file": (Turn.read_file, Turn.aread_file),
    "write_file": (Turn.write_file, Turn.awrite_file),
    "list_dir": (Turn.list_dir, Turn.alist_dir),
    "snapshot": (Turn.snapshot, Turn.asnapshot),
    "fork": (_fork, _afork),
    "close": (Turn.close, Turn.aclose),
}

#: (API, positional arguments, keyword arguments): what the host and the model get right and wrong.
CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("call", ("bash", {"command": "echo hi; echo err >&2"}), {}),
    ("call", ("bash", {"command": "exit 3"}), {}),
    ("call", ("no_such_tool", {}), {}),
    ("call", ("bash", "{not json"), {}),
    ("call", ("bash", {"command": 5}), {}),
    ("exec", (["sh", "-c", "cat; echo err >&2; exit 4"],), {"input": "in"}),
    ("exec", (["no-such-command"],), {}),
    ("exec", ("ls -l",), {}),
    ("exec", (["true"],), {"timeout": 0}),
    ("exec", (["true"],), {"user": "root"}),
    ("start", (["sh", "-c", "echo started"],), {}),
    ("start", (["true"],), {"timeout": -1}),
    ("start", ([],), {}),
    ("write_file", ("notes/a.txt", "written"), {}),
    ("write_file", ("/data/new.txt", b"x"), {}),
    ("write_file", ("/etc/passwd", b"x"), {}),
    ("write_file", (5, b"x"), {}),
    ("read_file", ("notes/a.txt",), {}),
    ("read_file", ("/data/species.txt",), {}),
    ("read_file", ("missing.txt",), {}),
    ("read_file", ("notes",), {}),
    ("read_file", ("a\0b",), {}),
    ("list_dir", (".",), {}),
    ("list_dir", ("/data",), {}),
    ("list_dir", ("missing",), {}),
    ("list_dir", (".",), {"limit": 0}),
    ("snapshot", (), {}),
    ("fork", (2,), {}),
    ("fork", (0,), {}),
    ("close", (), {}),
]

#: One case per API whose sandbox has died under it (the good arguments).
DEAD_CASES = [next(case for case in CASES if case[0] == api) for api in FACES]


def _seen(value: Any) -> Any:
    """A face's outcome as comparable data: the value, or the exception's type and words."""
    if isinstance(value, BaseException):
        # Figures the sandbox's death names (pids, exit statuses) differ from one death to the
        # next, and so does how it was seen first (its output closed, a write refused).
        words = re.sub(r"\d+", "N", str(value))
        if type(value) is SandboxError:
            words = words.partition("; ")[2]
        return (type(value).__name__, words)
    if isinstance(value, ToolResult):
        # How a death was seen (its output closed, a write refused) is the moment's, not the face's.
        text = re.sub(r"(the sandbox died while running this call) \(.*?\)\. ", r"\1. ", value.text)
        return ("ToolResult", value.is_error, text, [f.name for f in value.files])
    if isinstance(value, ExecResult):
        return ("ExecResult", value.returncode, value.stdout, value.stderr, value.timed_out)
    if isinstance(value, list):
        return (type(value).__name__, list(value), getattr(value, "truncated", None))
    if isinstance(value, TurnSnapshot):
        return ("TurnSnapshot", value.content_id, value.file_count, value.total_bytes)
    return value


def _run_sync(turn: Turn, cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
    seen = []
    for api, args, kwargs in cases:
        try:
            seen.append(_seen(FACES[api][0](turn, *args, **kwargs)))
        except Exception as exc:
            seen.append(_seen(exc))
    return seen


async def _run_async(
    turn: Turn, cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]]
) -> list[Any]:
    seen = []
    for api, args, kwargs in cases:
        try:
            seen.append(_seen(await FACES[api][1](turn, *args, **kwargs)))
        except Exception as exc:
            seen.append(_seen(exc))
    return seen


@pytest.fixture
def executor(tmp_path: Path) -> Executor:
    """Executors of bash turns on bubblewrap, the host's data read-only at /data."""
    from astralvessel.sandbox import Bubblewrap

    data = tmp_path / "data"
    data.mkdir()
    (data / "species.txt").write_text("otter\n")
    for path in (tmp_path, data):
        path.chmod(0o755)
    (data / "species.txt").chmod(0o644)
    registry = Registry()
    registry.add_builtin("bash")
    backend: Sandbox = Bubblewrap()
    return Executor(
        registry,
        sandbox=backend,
        mounts=(Mount.from_pair("/data", data),),
        timeout_seconds=30,
    )


def _both(executor: Executor, prepare: Callable[[Turn], None], cases: list[Any]) -> list[Any]:
    """The outcomes of ``cases`` through each face, on a fresh turn ``prepare`` readies."""
    with executor.turn() as turn:
        prepare(turn)
        sync_seen = _run_sync(turn, cases)
    with executor.turn() as turn:
        prepare(turn)
        async_seen = asyncio.run(_run_async(turn, cases))
    return [sync_seen, async_seen]


def test_an_open_turn_answers_both_faces_alike(executor: Executor) -> None:
    """On an open turn, every case gives the same result or the same error through both faces."""
    sync_seen, async_seen = _both(executor, lambda turn: None, CASES)
    assert sync_seen == async_seen
    # The cases reach what they are meant to: results, the host's errors, a file round trip.
    assert ("ExecResult", 4, b"in", b"err\n", False) in sync_seen
    assert sync_seen[CASES.index(("read_file", ("notes/a.txt",), {}))] == b"written"


def test_a_closed_turn_refuses_both_faces_alike(executor: Executor) -> None:
    """Once the turn is closed, each API raises (or refuses) the same way through both faces."""
    sync_seen, async_seen = _both(executor, Turn.close, CASES)
    assert sync_seen == async_seen
    assert ("TurnClosedError", sync_seen[0][1]) == sync_seen[0]


@pytest.mark.parametrize("case", DEAD_CASES, ids=[case[0] for case in DEAD_CASES])
def test_a_dead_sandbox_fails_both_faces_alike(executor: Executor, case: Any) -> None:
    """When the turn's sandbox has died, each API fails the same way through both faces."""

    def die(turn: Turn) -> None:
        kill_server(turn.session)

    sync_seen, async_seen = _both(executor, die, [case])
    assert sync_seen == async_seen


#: The mark of a step that waits in the sandbox, found on the host by its command line.
MARK = "astralvessel-parity-sleeper"
#: Steps that wait in the sandbox long enough for the turn to be closed under them.
IN_FLIGHT: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("exec", (["sh", "-c", f"sleep 30; : {MARK}"],), {}),
    ("start", (["sh", "-c", f"sleep 30; : {MARK}"],), {}),
    ("call", ("bash", {"command": f"sleep 30; : {MARK}"}), {}),
]
#: Each API's good case, sent to a sandbox server that is stopped, so it waits for the close.
STOPPED = [*IN_FLIGHT, *(case for case in DEAD_CASES if case[0] not in ("exec", "start", "call"))]
STOPPED.append(next(case for case in CASES if case[0] == "start"))


def _close_soon(turn: Turn) -> None:
    """Close ``turn`` from another thread once the case's command runs in its sandbox."""

    def close() -> None:
        for _ in range(600):  # a bound, not a timing: a step that never ran fails the test
            if host_processes_with(MARK):
                break
            threading.Event().wait(0.05)
        turn.close()

    threading.Thread(target=close, daemon=True).start()


def _stop_then_close(turn: Turn) -> None:
    """Stop the turn's sandbox server (SIGSTOP), and close the turn from another thread a
    moment later, while the case's request waits for an answer (or, on a slow host, before it
    was sent: either way the case must end alike through both faces)."""
    kill_server(turn.session, signal.SIGSTOP)
    timer = threading.Timer(0.5, turn.close)
    timer.daemon = True
    timer.start()


@pytest.mark.parametrize("case", STOPPED, ids=[f"{c[0]}-{i}" for i, c in enumerate(STOPPED)])
def test_a_turn_closed_while_its_request_waits_fails_both_faces_alike(
    executor: Executor, case: Any
) -> None:
    """A turn closed while a request waits on its (stopped) server ends that request the same
    way through both faces: ``TurnClosedError`` for the host's steps."""
    sync_seen, async_seen = _both(executor, _stop_then_close, [case])
    assert sync_seen == async_seen
    if case[0] not in ("call", "close"):
        assert sync_seen[0][0] == "TurnClosedError", sync_seen


@pytest.mark.parametrize("case", IN_FLIGHT, ids=[case[0] for case in IN_FLIGHT])
def test_a_turn_closed_under_a_step_fails_both_faces_alike(executor: Executor, case: Any) -> None:
    """A turn closed (by another thread) while a step waits in its sandbox ends that step the
    same way through both faces."""
    sync_seen, async_seen = _both(executor, _close_soon, [case])
    assert sync_seen == async_seen
