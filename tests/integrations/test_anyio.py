"""Async on anyio: a trio host awaits calls as an asyncio host does, in a real sandbox."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import trio

import astralvessel as av
from astralvessel.adapters import anthropic as anthropic_adapter
from astralvessel.sandbox._base import Sandbox

from ..conftest import MakeAgent

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
