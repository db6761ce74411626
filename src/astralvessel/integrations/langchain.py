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
``ainvoke`` both work. Outbox images and PDFs go along as image and file
content blocks. Needs the ``langchain`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..adapters._media import Attachment, MediaBudget, attachments, with_notes

try:
    from langchain_core.messages.content import (
        create_file_block,
        create_image_block,
        create_text_block,
    )
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the LangChain integration needs the langchain-core package: "
        "pip install 'astralvessel[langchain]'"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..executor import Turn
    from ..results import ToolResult

__all__ = ["BLOCKS", "structured_tools"]


def structured_tools(turn: Turn, *, budget: MediaBudget | None = None) -> list[StructuredTool]:
    """Every tool the turn's executor grants, as LangChain tools calling into ``turn``.

    A call's outbox images and PDFs go to the model as LangChain image and file
    content blocks after the text, within ``budget`` (``MediaBudget()`` by
    default); the text names every other file.
    """
    budget = budget or MediaBudget()
    executor = turn.executor
    return [
        StructuredTool(
            name=schema["name"],
            description=schema["description"],
            # A JSON Schema dict: LangChain hands the model's arguments over as they came,
            # and the turn checks them against the tool's schema.
            args_schema=schema["input_schema"],
            func=_sync(turn, schema["name"], budget),
            coroutine=_async(turn, schema["name"], budget),
            handle_tool_error=True,
        )
        for schema in executor.registry.schemas("anthropic", scopes=executor.scopes)
    ]


def _image(attachment: Attachment) -> Any:
    return create_image_block(base64=attachment.base64, mime_type=attachment.media_type)


def _file(attachment: Attachment) -> Any:
    return create_file_block(
        base64=attachment.base64, mime_type=attachment.media_type, filename=attachment.name
    )


#: The content block each kind of attachment becomes.
BLOCKS: Mapping[str, Callable[[Attachment], Any]] = MappingProxyType(
    {"image": _image, "pdf": _file}
)


def _content(result: ToolResult, budget: MediaBudget) -> str | list[Any]:
    """The tool message's content, or LangChain's ``ToolException`` for a failed call."""
    chosen, notes = attachments(
        result.files, kinds=frozenset(BLOCKS), budget=budget, api="LangChain"
    )
    text = with_notes(result.text, notes)
    if result.is_error:
        raise ToolException(text)
    if not chosen:
        return text
    return [create_text_block(text), *(BLOCKS[a.kind](a) for a in chosen)]


def _sync(turn: Turn, name: str, budget: MediaBudget) -> Callable[..., str | list[Any]]:
    def call(**arguments: Any) -> str | list[Any]:
        return _content(turn.call(name, arguments), budget)

    return call


def _async(turn: Turn, name: str, budget: MediaBudget) -> Callable[..., Awaitable[str | list[Any]]]:
    async def acall(**arguments: Any) -> str | list[Any]:
        return _content(await turn.acall(name, arguments), budget)

    return acall
