"""OpenAI Agents SDK: an executor's tools as ``FunctionTool`` s, one turn per agent run.

::

    from agents import Agent, Runner
    from astralvessel.integrations.openai_agents import function_tools

    agent = Agent(name="guide", tools=function_tools(executor))
    result = await Runner.run(agent, "Which species live in rivers?")

Each run gets its own turn (one sandbox, one workspace), opened by the run's
first tool call and shared by all its calls, including those of agents it
hands off to or calls as tools. The SDK keys nothing else to a run, so the
turn is tied to the run's ``usage`` object, which every tool context of one run
shares: it ends when the run's result is released. A failing call is returned
to the model as its error text, the SDK's own way ("return a string error
message, which will be sent back to the LLM"), so the run goes on. Needs the
``openai-agents`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._common import RunTurns

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the OpenAI Agents SDK integration needs the openai-agents package: "
        "pip install 'astralvessel[openai-agents]'"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..executor import Executor

__all__ = ["function_tools"]


def function_tools(executor: Executor, *, strict: bool = True) -> list[FunctionTool]:
    """Every tool the executor grants, as Agents SDK ``FunctionTool`` s.

    ``strict`` asks for strict JSON schemas where a tool's schema already allows
    it (see ``Registry.schemas``); the rest are sent as they are, non-strict.
    """
    turns = RunTurns(executor)
    schemas = executor.registry.schemas("openai-responses", scopes=executor.scopes, strict=strict)
    return [
        FunctionTool(
            name=schema["name"],
            description=schema["description"],
            params_json_schema=schema["parameters"],
            on_invoke_tool=_invoker(turns, schema["name"]),
            strict_json_schema=schema["strict"],
        )
        for schema in schemas
    ]


def _invoker(turns: RunTurns, name: str) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        # Every tool context of one run shares the run's usage object (agents as tools too).
        turn = turns.turn_for(context.usage)
        result = await turn.acall(name, arguments)
        return result.text

    return invoke
