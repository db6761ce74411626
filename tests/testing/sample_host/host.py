"""A sample host application: one loop that answers a question with the tide-pools agent.

The loop is what a product team writes: it hands the registry's schemas to a
model client, runs each tool call the model makes in one turn, and sends the
results back, until the model answers. It speaks three model APIs, each one
row of ``APIS``. The tests beside it test it three ways: on a fake sandbox,
on a real one, and with scripted model turns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

import astralvessel as av
from astralvessel.adapters import anthropic, openai

HERE = Path(__file__).parent
AGENT = HERE / "agent"
DATA = HERE / "data"


def build_registry(agent: av.Agent) -> av.Registry:
    """The agent's tools plus the host's own Python tool."""
    registry = av.Registry.for_agent(agent)

    @registry.tool
    def to_inches(centimetres: float) -> str:
        """Convert a length in centimetres to inches.

        Args:
            centimetres: The length to convert.
        """
        return f"{centimetres / 2.54:.1f} in"

    return registry


@attrs.frozen
class Api:
    """How the loop speaks one model API: send, read the reply, answer its tool calls."""

    dialect: str
    #: The conversation after the question; the reply appended (and whether it is final).
    first: Callable[[str], dict[str, Any]]
    append: Callable[[dict[str, Any], dict[str, Any]], bool]
    answer: Callable[[av.Turn, dict[str, Any], dict[str, Any]], None]


def _chat_append(state: dict[str, Any], reply: dict[str, Any]) -> bool:
    message = reply["choices"][0]["message"]
    state["messages"].append(message)
    return not message.get("tool_calls")


def _chat_answer(turn: av.Turn, state: dict[str, Any], reply: dict[str, Any]) -> None:
    state["messages"] += openai.run_chat_tool_calls(turn, reply)


def _responses_append(state: dict[str, Any], reply: dict[str, Any]) -> bool:
    state["input"] += reply["output"]
    return not openai.responses_tool_calls(reply)


def _responses_answer(turn: av.Turn, state: dict[str, Any], reply: dict[str, Any]) -> None:
    state["input"] += openai.run_responses_tool_calls(turn, reply)


def _anthropic_append(state: dict[str, Any], reply: dict[str, Any]) -> bool:
    state["messages"].append({"role": "assistant", "content": reply["content"]})
    return bool(reply["stop_reason"] != "tool_use")


def _anthropic_answer(turn: av.Turn, state: dict[str, Any], reply: dict[str, Any]) -> None:
    state["messages"].append(anthropic.run_tool_calls(turn, reply))


APIS = {
    "openai": Api(
        "openai",
        lambda q: {"messages": [{"role": "user", "content": q}]},
        _chat_append,
        _chat_answer,
    ),
    "openai-responses": Api(
        "openai-responses",
        lambda q: {"input": [{"role": "user", "content": q}]},
        _responses_append,
        _responses_answer,
    ),
    "anthropic": Api(
        "anthropic",
        lambda q: {"messages": [{"role": "user", "content": q}]},
        _anthropic_append,
        _anthropic_answer,
    ),
}


def ask(
    client: Any, executor: av.Executor, question: str, *, dialect: str = "openai"
) -> dict[str, Any]:
    """Answer ``question``: call the model until it stops asking for tools; return the conversation.

    ``client.create(**request)`` is the model (an SDK call returning a dict, or a
    scripted model in tests).
    """
    api = APIS[dialect]
    state = api.first(question)
    tools = executor.registry.schemas(dialect, scopes=executor.scopes)  # type: ignore[arg-type]
    with executor.turn() as turn:  # one sandbox for the whole exchange
        for _ in range(10):  # a model that never stops is cut off
            reply = client.create(tools=tools, **state)
            if api.append(state, reply):
                return state
            api.answer(turn, state, reply)
    return state


def executor_for(sandbox: av.sandbox.Sandbox | str | None = None) -> av.Executor:
    """The host's executor: the agent, the host's tool, the pool pages mounted at /data."""
    return av.Executor(
        build_registry(av.Agent.load(AGENT)), sandbox=sandbox, mounts={"/data": DATA}
    )
