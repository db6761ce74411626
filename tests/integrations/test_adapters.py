"""Adapters: model responses in, tool results out, as each API's plain dicts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import astralvessel as av
from astralvessel.adapters import ToolCall
from astralvessel.adapters import anthropic as anthropic_adapter
from astralvessel.adapters import openai as openai_adapter
from astralvessel.sandbox._base import Sandbox

from ..conftest import MakeAgent

ECHO_TOOL = """
name = "echo"
description = "Echo the arguments back."
command = ["python3", "-c", "import sys; print(sys.stdin.read())"]
"""


@pytest.fixture
def executor(make_agent: MakeAgent, backend: Sandbox) -> av.Executor:
    """A real sandboxed ``echo`` tool plus Python tools that only finish when run together."""
    agent = av.Agent.load(
        make_agent('[tools]\ndeclared = ["tools/echo.toml"]\n', {"tools/echo.toml": ECHO_TOOL})
    )
    registry = av.Registry.for_agent(agent)
    barrier = threading.Barrier(2, timeout=20)
    events: dict[str, asyncio.Event] = {}

    @registry.tool
    def meet(who: str) -> str:
        """Waits on a two-party barrier: it returns only if the other party runs at once."""
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return f"{who} waited alone"
        return f"{who} met"

    @registry.tool(timeout_seconds=20)
    async def ameet(who: str, other: str) -> str:
        """Sets its own event and waits for the other's: returns only if both run at once."""
        events.setdefault(who, asyncio.Event()).set()
        await events.setdefault(other, asyncio.Event()).wait()
        return f"{who} met"

    return av.Executor(registry, sandbox=backend)


CHAT_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-1",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "echo", "arguments": '{"q": "otter"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "echo", "arguments": "{not json"},
                    },
                ],
            },
        }
    ],
}


def test_chat_calls_are_parsed_from_response_or_message() -> None:
    """Chat tool calls come from the whole response or from its message, in order."""
    expected = [
        ToolCall(id="call_a", name="echo", arguments='{"q": "otter"}'),
        ToolCall(id="call_b", name="echo", arguments="{not json"),
    ]
    assert openai_adapter.chat_tool_calls(CHAT_RESPONSE) == expected
    assert openai_adapter.chat_tool_calls(CHAT_RESPONSE["choices"][0]["message"]) == expected
    assert openai_adapter.chat_tool_calls({"role": "assistant", "content": "hi"}) == []


def test_chat_tool_messages_from_a_real_sandbox(executor: av.Executor) -> None:
    """Each call gets a tool message by id; a call with broken JSON gets the refusal text."""
    with executor.turn() as turn:
        messages = openai_adapter.run_chat_tool_calls(turn, CHAT_RESPONSE)
    assert messages[0] == {"role": "tool", "tool_call_id": "call_a", "content": '{"q": "otter"}\n'}
    assert messages[1]["tool_call_id"] == "call_b"
    assert messages[1]["content"].startswith("Error: the arguments for echo are not valid JSON")


RESPONSES_RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "echo",
            "arguments": '{"q": 1}',
        },
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "nope",
            "arguments": "{}",
        },
    ],
}


def test_responses_outputs_from_a_real_sandbox(executor: av.Executor) -> None:
    """Responses function calls become function_call_output items by call_id; others are skipped."""
    with executor.turn() as turn:
        outputs = openai_adapter.run_responses_tool_calls(turn, RESPONSES_RESPONSE)
    assert outputs[0] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": '{"q": 1}\n',
    }
    assert outputs[1]["call_id"] == "call_2"
    assert outputs[1]["output"].startswith("Error: there is no tool named 'nope'")
    assert openai_adapter.responses_tool_calls(RESPONSES_RESPONSE["output"])[0].id == "call_1"


ANTHROPIC_RESPONSE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "stop_reason": "tool_use",
    "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"q": "vole"}},
        {"type": "tool_use", "id": "toolu_2", "name": "echo", "input": ["not", "an", "object"]},
    ],
}


def test_anthropic_results_from_a_real_sandbox(executor: av.Executor) -> None:
    """tool_use blocks become one user message of tool_result blocks, errors flagged."""
    with executor.turn() as turn:
        message = anthropic_adapter.run_tool_calls(turn, ANTHROPIC_RESPONSE)
    assert message["role"] == "user"
    first, second = message["content"]
    assert first == {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"q": "vole"}\n'}
    assert second["tool_use_id"] == "toolu_2"
    assert second["is_error"] is True
    assert "must be a JSON object, not an array" in second["content"]


class _Dumpable:
    """Looks like an SDK response object: it only offers ``model_dump()``."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def model_dump(self) -> dict[str, Any]:
        return self.data


def test_sdk_objects_are_accepted_through_model_dump() -> None:
    """An SDK object with ``model_dump()`` parses like its dict."""
    assert anthropic_adapter.tool_calls(_Dumpable(ANTHROPIC_RESPONSE))[0].id == "toolu_1"
    assert openai_adapter.chat_tool_calls(_Dumpable(CHAT_RESPONSE))[0].id == "call_a"


def _meet_calls() -> dict[str, Any]:
    return {
        "content": [
            {"type": "tool_use", "id": "t1", "name": "meet", "input": {"who": "a"}},
            {"type": "tool_use", "id": "t2", "name": "meet", "input": {"who": "b"}},
        ]
    }


def test_sync_calls_of_one_response_run_concurrently(executor: av.Executor) -> None:
    """The sync adapters run a response's calls on threads at once (each waits for the other)."""
    with executor.turn() as turn:
        message = anthropic_adapter.run_tool_calls(turn, _meet_calls())
    assert [block["content"] for block in message["content"]] == ["a met", "b met"]


def test_async_calls_of_one_response_run_concurrently(executor: av.Executor) -> None:
    """The async adapters gather a response's calls (each waits for the other's event)."""
    response = {
        "output": [
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "ameet",
                "arguments": '{"who": "a", "other": "b"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "ameet",
                "arguments": '{"who": "b", "other": "a"}',
            },
        ]
    }

    async def main() -> list[dict[str, Any]]:
        async with executor.turn() as turn:
            return await openai_adapter.arun_responses_tool_calls(turn, response)

    outputs = asyncio.run(main())
    assert [o["output"] for o in outputs] == ["a met", "b met"]


def test_async_chat_and_anthropic_twins(executor: av.Executor) -> None:
    """``arun_chat_tool_calls`` and anthropic ``arun_tool_calls`` give what their sync twins give."""

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with executor.turn() as turn:
            chat = await openai_adapter.arun_chat_tool_calls(turn, CHAT_RESPONSE)
            anthropic = await anthropic_adapter.arun_tool_calls(turn, ANTHROPIC_RESPONSE)
            return chat, anthropic

    chat, anthropic = asyncio.run(main())
    assert chat[0]["content"] == '{"q": "otter"}\n'
    assert anthropic["content"][0]["content"] == '{"q": "vole"}\n'
    assert anthropic["content"][1]["is_error"] is True
