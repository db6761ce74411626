"""LangChain: an executor's tools as ``StructuredTool`` s, one turn per LangChain run.

::

    from astralvessel.integrations.langchain import TurnPerRun

    turns = TurnPerRun(executor)
    agent = create_agent(model, tools=turns.tools())
    agent.invoke({"messages": [("user", "Which species live in rivers?")]},
                 config={"callbacks": [turns]})

LangChain tells a run's callback handlers when each of its runs (the agent,
its model calls, its tool calls) starts and ends, and under which parent run.
`TurnPerRun` is such a handler: passed in a run's ``callbacks``, it maps every
run below the root to that root, so a tool call finds its root run's turn
(opened at the run's first call) from its own run id, which LangChain hands
the tool with its ``callbacks``. The turn closes when the root run ends or
fails; a cancelled ``ainvoke`` ends with an error too. Concurrent runs,
``batch`` included, each have their own root and so their own turn.

``structured_tools(turn)`` binds the tools to one turn the host holds
instead. Either way, a failing call raises LangChain's ``ToolException``,
which the tools handle (``handle_tool_error=True``): the model gets a
``ToolMessage`` with ``status="error"`` and the error text, and the run goes
on. ``invoke`` and ``ainvoke`` both work. Outbox images and PDFs go along as
image and file content blocks. Needs the ``langchain`` extra.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from uuid import UUID

from .._ground._suggest import missing_extra
from ..adapters._media import Attachment, MediaBudget, attachments, with_notes
from ..errors import UsageError

try:
    from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
    from langchain_core.messages.content import (
        create_file_block,
        create_image_block,
        create_text_block,
    )
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_extra("the LangChain integration", "langchain-core", "langchain") from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..executor import Executor, Turn
    from ..results import ToolResult

__all__ = ["BLOCKS", "TurnPerRun", "structured_tools"]

#: How a tool finds its turn: from the callback manager LangChain hands it (None if none).
FindTurn = Callable[["BaseCallbackManager | None"], "Turn"]


def structured_tools(turn: Turn, *, budget: MediaBudget | None = None) -> list[StructuredTool]:
    """Every tool the turn's executor grants, as LangChain tools calling into ``turn``.

    A call's outbox images and PDFs go to the model as LangChain image and file
    content blocks after the text, within ``budget`` (``MediaBudget()`` by
    default); the text names every other file.
    """
    return _tools(turn.executor, lambda _: turn, budget or MediaBudget())


class _WholeArguments(StructuredTool):
    """A ``StructuredTool`` that hands the model's arguments to its function as one dict.

    LangChain spreads a tool's input as keyword arguments and then sets its own
    ``callbacks``, ``config`` and ``run_manager`` among them, so a model's argument
    of one of those names was dropped silently, never reaching the tool's schema
    check (and a declared tool with a ``config`` parameter never got it).
    """

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if isinstance(tool_input, dict):
            return (dict(tool_input),), {}
        return super()._to_args_and_kwargs(tool_input, tool_call_id)


def _tools(executor: Executor, find: FindTurn, budget: MediaBudget) -> list[StructuredTool]:
    return [
        _WholeArguments(
            name=schema["name"],
            description=schema["description"],
            # A JSON Schema dict: LangChain hands the model's arguments over as they came,
            # and the turn checks them against the tool's schema.
            args_schema=schema["input_schema"],
            func=_sync(find, schema["name"], budget),
            coroutine=_async(find, schema["name"], budget),
            handle_tool_error=True,
        )
        for schema in executor.registry.schemas("anthropic", scopes=executor.scopes)
    ]


class TurnPerRun(BaseCallbackHandler):
    """A turn per LangChain run: pass it in the run's ``callbacks``, give the agent ``tools()``.

    A root run is one whose parent this handler never saw start: the run it
    was handed to. Its turn opens at its first tool call and closes when it
    ends or fails. A tool called in a run without this handler raises
    ``UsageError``: it has no run to take a turn from.
    """

    def __init__(self, executor: Executor, *, budget: MediaBudget | None = None) -> None:
        self.executor = executor
        self.budget = budget or MediaBudget()
        #: Every run in progress, mapped to its root run.
        self._roots: dict[UUID, UUID] = {}
        #: The open turns, by root run.
        self._turns: dict[UUID, Turn] = {}
        self._lock = threading.Lock()

    def tools(self) -> list[StructuredTool]:
        """Every tool the executor grants, each calling into its run's turn."""
        return _tools(self.executor, self._turn, self.budget)

    def __len__(self) -> int:
        """How many runs have a turn open."""
        with self._lock:
            return len(self._turns)

    def _turn(self, callbacks: BaseCallbackManager | None) -> Turn:
        # The manager LangChain hands a tool is its own run's child: its parent is the tool run.
        run_id = callbacks.parent_run_id if callbacks is not None else None
        with self._lock:
            root = self._roots.get(run_id) if run_id is not None else None
            if root is None or callbacks is None or self not in callbacks.handlers:
                raise UsageError(
                    "this tool runs outside a LangChain run that has its TurnPerRun: "
                    "invoke with config={'callbacks': [turns]}"
                )
            turn = self._turns.get(root)
            if turn is None:
                turn = self._turns[root] = self.executor.turn()
        return turn

    def _started(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        with self._lock:
            parent = self._roots.get(parent_run_id) if parent_run_id is not None else None
            self._roots[run_id] = parent or run_id

    def _ended(self, run_id: UUID) -> None:
        with self._lock:
            root = self._roots.pop(run_id, None)
            turn = self._turns.pop(run_id, None) if root == run_id else None
        if turn is not None:
            turn.close()

    # LangChain's events: each start records the run's root, each end or error forgets the run.

    def on_chain_start(
        self,
        serialized: dict[str, Any],
        inputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_chain_end(self, outputs: dict[str, Any], *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id)


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


# ``callbacks`` in the signature: LangChain then hands the tool its run's child manager.


def _sync(find: FindTurn, name: str, budget: MediaBudget) -> Callable[..., str | list[Any]]:
    def call(
        arguments: dict[str, Any], callbacks: BaseCallbackManager | None = None
    ) -> str | list[Any]:
        return _content(find(callbacks).call(name, arguments), budget)

    return call


def _async(
    find: FindTurn, name: str, budget: MediaBudget
) -> Callable[..., Awaitable[str | list[Any]]]:
    async def acall(
        arguments: dict[str, Any], callbacks: BaseCallbackManager | None = None
    ) -> str | list[Any]:
        return _content(await find(callbacks).acall(name, arguments), budget)

    return acall
