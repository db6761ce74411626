"""LangChain: a turn's tools as ``StructuredTool`` s.

::

    from astralvessel.integrations.langchain import structured_tools

    with executor.turn() as turn:                   # one agent run, one sandbox
        agent = create_agent(model, tools=structured_tools(turn))
        agent.invoke({"messages": [("user", "Which species live in rivers?")]})

LangChain tells a tool nothing about the agent run it serves (a tool sees only
its own call's callbacks), and an agent run is the host's own ``invoke``, so
the host opens the run's turn around it and hands the turn to the tools. A
failing call raises LangChain's ``ToolException``, which the tools handle
(``handle_tool_error=True``): the model gets a ``ToolMessage`` with
``status="error"`` and the error text, and the run goes on. ``invoke`` and
``ainvoke`` both work. Needs the ``langchain`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the LangChain integration needs the langchain-core package: "
        "pip install 'astralvessel[langchain]'"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..executor import Turn
    from ..results import ToolResult

__all__ = ["structured_tools"]


def structured_tools(turn: Turn) -> list[StructuredTool]:
    """Every tool the turn's executor grants, as LangChain tools calling into ``turn``."""
    executor = turn.executor
    return [
        StructuredTool(
            name=schema["name"],
            description=schema["description"],
            # A JSON Schema dict: LangChain hands the model's arguments over as they came,
            # and the turn checks them against the tool's schema.
            args_schema=schema["input_schema"],
            func=_sync(turn, schema["name"]),
            coroutine=_async(turn, schema["name"]),
            handle_tool_error=True,
        )
        for schema in executor.registry.schemas("anthropic", scopes=executor.scopes)
    ]


def _text(result: ToolResult) -> str:
    if result.is_error:
        raise ToolException(result.text)
    return result.text


def _sync(turn: Turn, name: str) -> Callable[..., str]:
    def call(**arguments: Any) -> str:
        return _text(turn.call(name, arguments))

    return call


def _async(turn: Turn, name: str) -> Callable[..., Awaitable[str]]:
    async def acall(**arguments: Any) -> str:
        return _text(await turn.acall(name, arguments))

    return acall
