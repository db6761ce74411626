"""The OpenAI and Anthropic SDKs' own types accept every schema and message we produce."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletionToolMessageParam, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, ResponseInputItemParam
from pydantic import TypeAdapter

import astralvessel as av
from astralvessel.adapters import anthropic as anthropic_adapter
from astralvessel.adapters import openai as openai_adapter
from astralvessel.sandbox._base import Sandbox

from ..conftest import MakeAgent
from .test_adapters import ANTHROPIC_RESPONSE, CHAT_RESPONSE, ECHO_TOOL, RESPONSES_RESPONSE

EXAMPLE = Path(__file__).parents[2] / "examples" / "field-guide"


def _materialized(value: object) -> object:
    # The SDKs' params use Iterable[...], which pydantic validates lazily: walking the
    # result is what checks each item.
    if isinstance(value, Iterator):
        return [_materialized(item) for item in value]
    if isinstance(value, dict):
        return {key: _materialized(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_materialized(item) for item in value]
    return value


def sdk_validate(kind: Any, value: object) -> None:
    """Raise pydantic's ValidationError unless the SDK's type ``kind`` accepts ``value``."""
    adapter = TypeAdapter(kind)  # kept alive while its lazy validators run
    _materialized(adapter.validate_python(value))


@pytest.fixture
def executor(make_agent: MakeAgent, backend: Sandbox) -> av.Executor:
    """A real sandboxed ``echo`` tool."""
    folder = make_agent('[tools]\ndeclared = ["tools/echo.toml"]\n', {"tools/echo.toml": ECHO_TOOL})
    return av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)


@pytest.fixture
def registry() -> av.Registry:
    """The example agent: built-ins and declared tools, plus one strict-compatible tool."""
    registry = av.Registry.for_agent(av.Agent.load(EXAMPLE))
    for name in ("bash", "webfetch", "websearch"):
        registry.add_builtin(name)

    @registry.tool
    def habitat(name: str) -> str:
        """Where one species lives."""
        return name

    return registry


SCHEMA_TYPES = {
    "openai": ChatCompletionToolParam,
    "openai-responses": FunctionToolParam,
    "anthropic": ToolParam,
}


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("dialect", list(SCHEMA_TYPES))
def test_every_schema_passes_the_sdk_type(
    registry: av.Registry, dialect: str, strict: bool
) -> None:
    """Every tool schema of every dialect validates as the SDK's own tool parameter type."""
    for schema in registry.schemas(dialect, strict=strict):  # type: ignore[arg-type]
        sdk_validate(SCHEMA_TYPES[dialect], schema)


def test_a_strict_schema_misses_the_required_key_without_us() -> None:
    """The check can fail: a Responses tool without ``strict`` is refused by the SDK type."""
    with pytest.raises(ValueError, match="strict"):
        sdk_validate(FunctionToolParam, {"type": "function", "name": "t", "parameters": {}})


def test_chat_messages_pass_the_sdk_type(executor: av.Executor) -> None:
    """Chat Completions tool messages validate as ``ChatCompletionToolMessageParam``."""
    with executor.turn() as turn:
        messages = openai_adapter.run_chat_tool_calls(turn, CHAT_RESPONSE)
    for message in messages:
        sdk_validate(ChatCompletionToolMessageParam, message)


def test_responses_items_pass_the_sdk_type(executor: av.Executor) -> None:
    """Responses ``function_call_output`` items validate as ``ResponseInputItemParam``."""
    with executor.turn() as turn:
        items = openai_adapter.run_responses_tool_calls(turn, RESPONSES_RESPONSE)
    for item in items:
        sdk_validate(ResponseInputItemParam, item)


def test_anthropic_message_passes_the_sdk_type(executor: av.Executor) -> None:
    """The Anthropic tool-result user message validates as ``MessageParam``."""
    with executor.turn() as turn:
        message = anthropic_adapter.run_tool_calls(turn, ANTHROPIC_RESPONSE)
    sdk_validate(MessageParam, message)
