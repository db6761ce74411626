"""OpenAI Agents SDK: an executor's tools as ``FunctionTool`` s, one turn per agent run.

::

    from agents import Agent, Runner
    from astralvessel.integrations.openai_agents import function_tools

    agent = Agent(name="guide", tools=function_tools(executor))
    async with executor.turn() as turn:             # this run's sandbox
        result = await Runner.run(agent, "Which species live in rivers?", context=turn)

The SDK hands every tool the run's context object (``RunContextWrapper.context``,
what the host passed as ``Runner.run(context=...)``), the SDK's channel for a
run's dependencies. When it is a `Turn`, or has a ``vessel_turn`` attribute
holding one, every call of the run, including those of agents it hands off to
or calls as tools, runs in that turn, which the host's ``async with`` closes
when the run ends, fails or is cancelled. A run with no turn in its context
gets one of its own, opened by its first call and keyed to the run's ``usage``
object (which every tool context of one run shares): that turn can only end
when the run's result is released, so pass the turn when the host can. A
failing call is returned to the model as its error text, the SDK's own way
("return a string error message, which will be sent back to the LLM"), so the
run goes on. Outbox images and PDFs go along as the SDK's image and file
outputs.

The other way round, `VesselSandboxClient` is the SDK's own sandbox client
(``agents.sandbox``): a ``SandboxAgent`` run with
``SandboxRunConfig(client=VesselSandboxClient(executor))`` gets one turn per
sandbox session, its manifest checked against the executor's policy. Needs
the ``openai-agents`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .._ground._suggest import missing_extra
from ..adapters._media import Attachment, MediaBudget, attachments, data_url, with_notes
from ..errors import UsageError
from ..executor import Turn
from ._common import RunTurns

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_extra(
        "the OpenAI Agents SDK integration", "openai-agents", "openai-agents"
    ) from exc

# The sandbox client needs the SDK too, so it loads once the SDK is known to be there.
from ._openai_sandbox import (
    VesselSandboxClient,
    VesselSandboxClientOptions,
    VesselSandboxSessionState,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..executor import Executor
    from ..results import ToolResult

__all__ = [
    "OUTPUTS",
    "VesselSandboxClient",
    "VesselSandboxClientOptions",
    "VesselSandboxSessionState",
    "function_tools",
    "tool_output",
]


def function_tools(
    executor: Executor, *, strict: bool = True, budget: MediaBudget | None = None
) -> list[FunctionTool]:
    """Every tool the executor grants, as Agents SDK ``FunctionTool`` s.

    ``strict`` asks for strict JSON schemas where a tool's schema already allows
    it (see ``Registry.schemas``); the rest are sent as they are, non-strict.
    A call's outbox images and PDFs go to the model as the SDK's image and file
    outputs within ``budget`` (``MediaBudget()`` by default); the text names
    every other file.
    """
    budget = budget or MediaBudget()
    turns = RunTurns(executor)
    schemas = executor.registry.schemas("openai-responses", scopes=executor.scopes, strict=strict)
    return [
        FunctionTool(
            name=schema["name"],
            description=schema["description"],
            params_json_schema=schema["parameters"],
            on_invoke_tool=_invoker(turns, schema["name"], budget),
            strict_json_schema=schema["strict"],
        )
        for schema in schemas
    ]


def _image(attachment: Attachment) -> dict[str, Any]:
    return {"type": "image", "image_url": data_url(attachment)}


def _file(attachment: Attachment) -> dict[str, Any]:
    return {"type": "file", "file_data": data_url(attachment), "filename": attachment.name}


#: The SDK's tool output each kind of attachment becomes.
OUTPUTS: Mapping[str, Callable[[Attachment], dict[str, Any]]] = MappingProxyType(
    {"image": _image, "pdf": _file}
)


def tool_output(result: ToolResult, budget: MediaBudget) -> str | list[dict[str, Any]]:
    """What the model gets for a result: its text, or its text and its outbox files."""
    chosen, notes = attachments(
        result.files, kinds=frozenset(OUTPUTS), budget=budget, api="the Agents SDK"
    )
    text = with_notes(result.text, notes)
    if not chosen:
        return text
    return [{"type": "text", "text": text}, *(OUTPUTS[a.kind](a) for a in chosen)]


def _invoker(
    turns: RunTurns, name: str, budget: MediaBudget
) -> Callable[[ToolContext[Any], str], Awaitable[str | list[dict[str, Any]]]]:
    async def invoke(context: ToolContext[Any], arguments: str) -> str | list[dict[str, Any]]:
        return tool_output(await _turn(turns, context).acall(name, arguments), budget)

    return invoke


def _turn(turns: RunTurns, context: ToolContext[Any]) -> Turn:
    """The turn the run's context holds, or else the run's own (keyed to its usage)."""
    held = context.context
    held = getattr(held, "vessel_turn", held)
    if isinstance(held, Turn):
        if held.executor is not turns.executor:
            raise UsageError(
                "the run's context holds a turn of another executor than these tools'; "
                "open it with the executor function_tools() was given"
            )
        return held
    # Every tool context of one run shares the run's usage object (agents as tools too).
    return turns.turn_for(context.usage)
