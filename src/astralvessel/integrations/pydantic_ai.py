"""pydantic-ai: an executor's tools as a toolset, one turn per agent run.

::

    from pydantic_ai import Agent
    from astralvessel.integrations.pydantic_ai import VesselToolset

    agent = Agent("openai:gpt-4.1", toolsets=[VesselToolset(executor)])
    result = await agent.run("Which species live in rivers?")

The agent asks the toolset for a fresh copy per run (``for_run``) and enters
and exits it around the run: that copy opens the run's turn (one sandbox, one
workspace) on entry and ends it on exit, however the run ends. A failing call
raises pydantic-ai's ``ToolFailed`` with the error text, so the model sees a
failed tool result and adapts, without spending the tool's retry budget.
Arguments are checked by the turn against the tool's own schema, so the
toolset lets pydantic-ai pass them through as they came. Outbox images and
PDFs go back as ``BinaryContent`` after the text. Needs the
``pydantic-ai`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._ground._suggest import missing_extra
from ..adapters._media import MediaBudget, attachments, with_notes

try:
    from pydantic_ai.exceptions import ToolFailed
    from pydantic_ai.messages import BinaryContent
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, ValidationError, core_schema
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_extra("the pydantic-ai integration", "pydantic-ai-slim", "pydantic-ai") from exc

if TYPE_CHECKING:
    from pydantic_ai import RunContext
    from typing_extensions import Self

    from ..executor import Executor, Turn
    from ..results import ToolResult

__all__ = ["VesselToolset"]

#: The key under which ``_PassThrough`` hands over arguments that are not a JSON object's
#: text: no JSON object has it (its keys are strings), so no model can forge it.
_RAW = object()


class _PassThrough:
    """pydantic-ai's argument validator for the toolset: it checks nothing.

    The turn validates arguments against the tool's schema and answers a mistake
    with a result the model can act on; pydantic-ai only needs to hand them over.
    Text pydantic-ai cannot parse (not JSON, nested 10 000 deep, a lone surrogate)
    goes on as it came, so the turn refuses it as a failed call instead of
    pydantic-ai spending the tool's retries (none) and failing the whole run.
    """

    _objects = SchemaValidator(schema=core_schema.dict_schema())

    def validate_json(self, input: str | bytes | bytearray, **kwargs: Any) -> dict[Any, Any]:
        try:
            parsed: dict[Any, Any] = self._objects.validate_json(input)
        except (ValidationError, RecursionError, ValueError):
            return {_RAW: input}
        return parsed

    def validate_python(self, input: Any, **kwargs: Any) -> Any:
        return input if isinstance(input, dict) else {_RAW: input}


_PASS_THROUGH = _PassThrough()


class VesselToolset(AbstractToolset[Any]):
    """Every tool an executor grants, as one pydantic-ai toolset; each run gets its own turn."""

    def __init__(
        self,
        executor: Executor,
        *,
        id: str | None = None,
        strict: bool = False,
        budget: MediaBudget | None = None,
    ) -> None:
        self.executor = executor
        self._id = id
        self._strict = strict
        #: How many of a call's outbox images and PDFs go to the model as binary content.
        self.budget = budget or MediaBudget()
        self._turn: Turn | None = None

    @property
    def id(self) -> str | None:
        return self._id

    async def for_run(self, ctx: RunContext[Any]) -> VesselToolset:
        """A fresh copy for one run: its turn is the run's alone."""
        return VesselToolset(self.executor, id=self._id, strict=self._strict, budget=self.budget)

    async def __aenter__(self) -> Self:
        if self._turn is None:
            self._turn = self.executor.turn()
        return self

    async def __aexit__(self, *args: object) -> bool | None:
        turn, self._turn = self._turn, None
        if turn is not None:
            await turn.aclose()
        return None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        executor = self.executor
        schemas = executor.registry.schemas(
            "openai-responses", scopes=executor.scopes, strict=self._strict
        )
        return {
            schema["name"]: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=schema["name"],
                    description=schema["description"],
                    parameters_json_schema=schema["parameters"],
                    strict=schema["strict"] or None,
                ),
                max_retries=0,
                args_validator=_PASS_THROUGH,
            )
            for schema in schemas
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        if self._turn is None:
            # Called outside a run (the agent enters every toolset it runs with).
            raise RuntimeError("VesselToolset called outside an agent run; enter it first")
        arguments = tool_args.get(_RAW, tool_args)  # type: ignore[call-overload]
        result = await self._turn.acall(name, arguments)
        if result.is_error:
            raise ToolFailed(result.text)
        return _return_value(result, self.budget)


def _return_value(result: ToolResult, budget: MediaBudget) -> str | list[str | BinaryContent]:
    """The result's text, or its text and its outbox images and PDFs as binary content."""
    chosen, notes = attachments(
        result.files, kinds=frozenset({"image", "pdf"}), budget=budget, api="pydantic-ai"
    )
    text = with_notes(result.text, notes)
    if not chosen:
        return text
    return [text, *(BinaryContent(data=a.data, media_type=a.media_type) for a in chosen)]
