"""Async on anyio: a trio host awaits calls as an asyncio host does, in every real backend."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import trio

import astralvessel as av
from astralvessel.adapters import anthropic as anthropic_adapter
from astralvessel.errors import TurnClosedError
from astralvessel.sandbox._base import Sandbox
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox.docker import Docker, DockerExec

from ..conftest import MakeAgent
from ..docker.conftest import BASE_IMAGE, NOPYTHON_IMAGE

ECHO_TOOL = """
name = "echo"
description = "Echo the arguments back."
command = ["python3", "-c", "import sys; print(sys.stdin.read(), end='')"]
"""


@pytest.fixture
def executor(make_agent: MakeAgent, backend: Sandbox) -> av.Executor:
    """A sandboxed ``echo`` tool and ``bash`` in a real bubblewrap sandbox."""
    folder = make_agent(
        '[tools]\nbuiltin = ["bash", "read"]\ndeclared = ["tools/echo.toml"]\n',
        {"tools/echo.toml": ECHO_TOOL},
    )
    return av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)


def test_trio_awaits_a_call(executor: av.Executor) -> None:
    """Under trio, ``async with`` a turn and ``await turn.acall`` run a declared tool."""

    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            return await turn.acall("echo", {"q": "otter"})

    result = trio.run(main)
    assert result.text == '{"q": "otter"}'
    assert result.backend == "bubblewrap"


def test_trio_awaits_a_file_tool(executor: av.Executor) -> None:
    """Under trio, the server's file tools answer too (an error result for a missing file)."""

    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            return await turn.acall("read", {"path": "/workspace/missing.txt"})

    result = trio.run(main)
    assert result.is_error
    assert "missing.txt" in result.text


def test_trio_runs_an_adapter_batch_concurrently(executor: av.Executor) -> None:
    """Under trio, the adapters' async twins run a response's calls and answer in order."""
    response: dict[str, Any] = {
        "content": [
            {"type": "tool_use", "id": "t1", "name": "echo", "input": {"q": 1}},
            {"type": "tool_use", "id": "t2", "name": "bash", "input": {"command": "echo two"}},
        ]
    }

    async def main() -> dict[str, Any]:
        async with executor.turn() as turn:
            return await anthropic_adapter.arun_tool_calls(turn, response)

    first, second = trio.run(main)["content"]
    assert first["content"] == '{"q": 1}'
    assert second["content"].startswith("two")


def _running(pattern: str) -> bool:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False)
    return found.returncode == 0


def test_trio_cancellation_kills_the_call(executor: av.Executor) -> None:
    """A call cancelled by trio is killed in the sandbox, and the turn goes on working."""
    marker = "sleep 61.4242"

    async def main() -> tuple[bool, bool, av.ToolResult]:
        async with executor.turn() as turn:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(turn.acall, "bash", {"command": marker})
                while not _running(marker):  # the command has started in the sandbox
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
            with trio.move_on_after(30):  # a bounded wait for the kill, not a timing claim
                while _running(marker):
                    await trio.sleep(0.05)
            after = await turn.acall("echo", {"q": "after"})
        return nursery.cancel_scope.cancelled_caught, _running(marker), after

    cancelled, still_running, after = trio.run(main)
    assert cancelled
    assert not still_running
    assert after.text == '{"q": "after"}'


#: Every backend a trio host awaits calls on: name, and how to build it on the offline images.
BACKENDS: dict[str, Callable[[], Sandbox]] = {
    "bubblewrap": lambda: get_backend("bubblewrap"),
    "docker": lambda: Docker(base_image=BASE_IMAGE, pull=False),
    "docker-exec": lambda: DockerExec(image=NOPYTHON_IMAGE, pull=False),
}


@pytest.fixture(params=sorted(BACKENDS))
def any_executor(request: pytest.FixtureRequest) -> av.Executor:
    """``bash`` in each backend: bubblewrap, Docker with its server, and docker-exec."""
    registry = av.Registry()
    registry.add_builtin("bash")
    # A call's own timeout far past the test's bounded waits: only a cancel can end it early.
    return av.Executor(registry, sandbox=BACKENDS[request.param](), timeout_seconds=120)


def test_trio_awaits_a_call_on_every_backend(any_executor: av.Executor) -> None:
    """Under trio, each backend runs a sandboxed call and a batch of concurrent ones."""

    async def main() -> list[av.ToolResult]:
        async with any_executor.turn() as turn:
            results: list[av.ToolResult] = [await turn.acall("bash", {"command": "echo otter"})]

            async def one(word: str) -> None:
                results.append(await turn.acall("bash", {"command": f"echo {word}"}))

            async with trio.open_nursery() as nursery:
                for word in ("vole", "stoat", "heron"):
                    nursery.start_soon(one, word)
        return results

    first, *batch = trio.run(main)
    assert first.text.splitlines()[0] == "otter"
    assert first.backend == any_executor.sandbox.name
    assert sorted(result.text.splitlines()[0] for result in batch) == ["heron", "stoat", "vole"]


def test_trio_cancellation_kills_the_call_on_every_backend(any_executor: av.Executor) -> None:
    """A call cancelled by trio is killed in each backend, and the turn's next call runs."""
    marker = f"sleep 97.{os.getpid()}"

    async def main() -> tuple[bool, bool, av.ToolResult]:
        async with any_executor.turn() as turn:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(turn.acall, "bash", {"command": marker})
                    with trio.move_on_after(60):  # a bounded wait for the start, not a timing
                        while not _running(marker):
                            await trio.sleep(0.05)
                    scope.cancel()
            with trio.move_on_after(60):  # a bounded wait for the kill, not a timing claim
                while _running(marker):
                    await trio.sleep(0.05)
            after = await turn.acall("bash", {"command": "echo after"})
        return scope.cancelled_caught, _running(marker), after

    cancelled, still_running, after = trio.run(main)
    assert cancelled
    assert not still_running
    assert after.text == "after\n[exit code 0]"


def test_trio_cancel_before_the_call_starts_leaves_nothing_running(
    any_executor: av.Executor,
) -> None:
    """A call cancelled before it reaches the sandbox never runs, and the next call does not wait."""
    marker = f"sleep 89.{os.getpid()}"

    async def main() -> tuple[bool, av.ToolResult]:
        async with any_executor.turn() as turn:
            await turn.acall("bash", {"command": "true"})  # the sandbox is up
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(turn.acall, "bash", {"command": marker})
                    await trio.lowlevel.checkpoint()  # the call is on its way, not yet running
                    scope.cancel()
            after = await turn.acall("bash", {"command": "echo after"})
        return scope.cancelled_caught, after

    cancelled, after = trio.run(main)
    assert cancelled
    assert after.text.splitlines()[0] == "after"
    assert not _running(marker)


def test_trio_cancelled_turn_still_closes_its_sandbox(any_executor: av.Executor) -> None:
    """A cancel that unwinds ``async with executor.turn()`` still closes the turn and its sandbox."""
    marker = f"sleep 73.{os.getpid()}"
    held: list[av.Turn] = []

    async def main() -> bool:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    async with any_executor.turn() as turn:
                        held.append(turn)
                        await turn.acall("bash", {"command": marker})

                nursery.start_soon(run)
                with trio.move_on_after(60):  # a bounded wait for the start, not a timing
                    while not _running(marker):
                        await trio.sleep(0.05)
                scope.cancel()
        return scope.cancelled_caught

    assert trio.run(main)
    with pytest.raises(TurnClosedError):
        held[0].call("bash", {"command": "true"})
    assert not _running(marker)
