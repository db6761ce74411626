"""Warm turns: sandboxes started ahead for an executor's policy, on real bubblewrap sandboxes."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator

import pytest

from astralvessel import BackendUnavailableError, Executor, Registry, ToolSpec, Turn, UsageError
from astralvessel.sandbox import Bubblewrap, SandboxSession
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._session import ServerSession

from ..forking import in_forked_child

# Bounds for waiting on the pool and on a process to end: never a timing assertion.
SETTLE = 60.0

TOOLS = (
    ToolSpec.command_tool(
        "mark", "Leave a file in the workspace.", ["/bin/sh", "-c", "touch $HOME/mark"]
    ),
    ToolSpec.command_tool("look", "List the workspace.", ["/bin/sh", "-c", "ls -A $HOME"]),
    ToolSpec.command_tool(
        "py", "Run Python.", ["python3", "-c", "import json,sys; print(json.load(sys.stdin))"]
    ),
)


def executor(warm: int, sandbox: Bubblewrap | None = None) -> Executor:
    """An executor of the test tools on bubblewrap keeping ``warm`` sandboxes started."""
    return Executor(Registry(TOOLS), sandbox=sandbox or Bubblewrap(), warm=warm)


@pytest.fixture
def warm_one() -> Iterator[Executor]:
    """An executor with one warm sandbox, already started."""
    with executor(1) as ex:
        assert ex.wait_warm(SETTLE)
        yield ex


def waiting(ex: Executor) -> list[SandboxSession]:
    """The sandboxes the executor's pool holds now."""
    assert ex._warm is not None
    return list(ex._warm._ready)


def process_of(session: SandboxSession) -> int:
    """The host pid of the bwrap process that holds ``session``'s sandbox."""
    assert isinstance(session, ServerSession)
    channel = session.channel
    assert isinstance(channel, PipeChannel)
    return channel.process.pid


def settle(condition: object, what: str) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    deadline = time.monotonic() + SETTLE
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)


def test_a_turn_takes_a_warm_sandbox(warm_one: Executor) -> None:
    """Opening a turn hands it the sandbox the pool had started, and its calls run there."""
    ready = waiting(warm_one)
    with warm_one.turn() as turn:
        result = turn.call("py", {"n": 1})
        assert not result.is_error, result.text
        assert result.text.strip() == "{'n': 1}"
        assert turn.session in ready


def test_a_sandbox_never_serves_two_turns(warm_one: Executor) -> None:
    """A later turn gets a different sandbox and a fresh workspace; the first one is gone."""
    with warm_one.turn() as first:
        assert not first.call("mark").is_error
        assert "mark" in first.call("look").text.split()
        used = first.session
    assert not used.alive()
    assert warm_one.wait_warm(SETTLE)
    with warm_one.turn() as second:
        result = second.call("look")
        assert not result.is_error, result.text
        assert "mark" not in result.text
        assert second.session is not used


def test_a_warm_sandbox_that_died_is_not_handed_out(warm_one: Executor) -> None:
    """A sandbox killed while it waited is discarded; the turn gets a running one."""
    (dead,) = waiting(warm_one)
    os.killpg(process_of(dead), signal.SIGKILL)
    settle(lambda: not dead.alive(), "the killed sandbox's session to notice")
    with warm_one.turn() as turn:
        result = turn.call("py", {"alive": True})
        assert not result.is_error, result.text
        assert turn.session is not dead


def test_close_kills_the_waiting_sandboxes() -> None:
    """``close`` kills every sandbox still waiting; a turn opened afterwards starts its own."""
    ex = executor(2)
    assert ex.wait_warm(SETTLE)
    ready = waiting(ex)
    assert len(ready) == 2
    ex.close()
    for session in ready:
        assert not session.alive()
        assert isinstance(session, ServerSession)
        assert isinstance(session.channel, PipeChannel)
        assert session.channel.process.poll() is not None
    with ex.turn() as turn:
        assert not turn.call("py", {}).is_error
        assert turn.session not in ready
    ex.close()


async def test_async_with_releases_the_pool() -> None:
    """``async with Executor(...)`` serves async turns from the pool and closes it on exit."""
    async with executor(1) as ex:
        assert ex.wait_warm(SETTLE)
        ready = waiting(ex)
        async with ex.turn() as turn:
            result = await turn.acall("py", {"a": 1})
            assert not result.is_error, result.text
            assert turn.session in ready
        pool = ex._warm
        assert pool is not None
    assert ex._warm is None
    assert pool.ready == 0


def test_warm_turns_outlive_the_threads_that_opened_them() -> None:
    """A pool made on a thread that ended, and turns opened on others, keep serving calls."""
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        ex = threads.submit(executor, 2).result()
    try:
        assert ex.wait_warm(SETTLE)

        def open_turn() -> Turn:
            turn = ex.turn()
            assert not turn.call("py", {"step": 1}).is_error
            return turn

        with concurrent.futures.ThreadPoolExecutor(1) as threads:
            turn = threads.submit(open_turn).result()
        with turn:
            result = turn.call("py", {"step": 2})
            assert not result.is_error, result.text
    finally:
        ex.close()


def test_many_turns_at_once() -> None:
    """Twelve turns opened at once on four threads, with three warm, all answer; none shares."""
    with executor(3) as ex:
        assert ex.wait_warm(SETTLE)

        def one(n: int) -> tuple[str, bool, SandboxSession]:
            with ex.turn() as turn:
                result = turn.call("py", {"n": n})
                return result.text.strip(), result.is_error, turn.session

        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            outcomes = list(threads.map(one, range(12)))
    assert [(text, error) for text, error, _ in outcomes] == [
        (f"{{'n': {n}}}", False) for n in range(12)
    ]
    assert len({id(session) for _, _, session in outcomes}) == 12


@pytest.mark.parametrize("warm", [-1, True, 1.5, "2"])
def test_warm_must_be_a_count(warm: object) -> None:
    """``warm`` is a non-negative integer; anything else is the host's mistake."""
    with pytest.raises(UsageError, match="warm"):
        Executor(Registry(TOOLS), sandbox=Bubblewrap(), warm=warm)  # type: ignore[arg-type]


def test_a_backend_that_cannot_start_raises_not_loops() -> None:
    """When no sandbox can start, waiting for the pool and opening a turn raise the host's error."""
    with executor(1, Bubblewrap("/nonexistent/bwrap")) as ex:
        with pytest.raises(BackendUnavailableError):
            ex.wait_warm(SETTLE)
        with ex.turn() as turn, pytest.raises(BackendUnavailableError):
            turn.call("py", {})


def test_a_forked_child_leaves_the_warm_sandboxes_to_its_parent(warm_one: Executor) -> None:
    """The child starts its own sandbox, and closing the executor there kills none of the pool's."""
    (ready,) = waiting(warm_one)

    def child() -> str:
        with warm_one.turn() as turn:
            result = turn.call("look", {})
            own = turn.session is not ready
        warm_one.close()  # as the executor's finalizer would at the child's exit
        return f"own sandbox: {own}, error: {result.is_error}"

    assert in_forked_child(child) == "own sandbox: True, error: False"
    assert ready.alive()
    with warm_one.turn() as turn:
        assert turn.session is ready
        assert not turn.call("look", {}).is_error
