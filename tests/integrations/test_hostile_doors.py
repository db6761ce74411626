"""What a model can send, through every loop adapter and framework integration.

Each hostile call (2 MB arguments, nesting 70, 200 and 10 000 levels deep, NUL
bytes, lone surrogates, wrong types, unknown tools, missing fields, text that is
not JSON, huge numbers, duplicate keys) comes back in the framework's own form of
a failed tool result, with a message that says what to change, and the run and
its turn go on. A malformed response (the host's or the API's mistake) raises
``UsageError``. The frameworks are the real packages, driven by scripted models.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from agents import Agent as AgentsAgent
from agents import ModelResponse, RunConfig, Runner
from agents.models.interface import Model
from agents.usage import Usage
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import ToolMessage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.messages import ModelResponse as PydanticResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

import astralvessel as av
from astralvessel.adapters import anthropic as anthropic_adapter
from astralvessel.adapters import openai as openai_adapter
from astralvessel.integrations.langchain import structured_tools
from astralvessel.integrations.openai_agents import function_tools
from astralvessel.integrations.pydantic_ai import VesselToolset
from astralvessel.sandbox._base import Sandbox

from ..fuzz.test_fuzz import BUDGET, RAW_ARGUMENTS

#: A declared tool whose parameters use the names LangChain keeps for itself.
RESERVED_TOOL = """
name = "reserved"
description = "Print the arguments it was given."
command = ["python3", "-c", "import sys; print(sys.stdin.read(), end='')"]
[parameters]
type = "object"
additionalProperties = false
[parameters.properties.config]
type = "string"
[parameters.properties.callbacks]
type = "string"
[parameters.properties.run_manager]
type = "string"
"""


@attrs.frozen
class Hostile:
    """One thing a model may send: the tool it names, its arguments' text, and what the
    error it gets back must say (``None``: the call is fine and runs)."""

    tool: str
    text: str
    says: str | None

    @property
    def parsed(self) -> object:
        """The arguments as a framework that parses JSON hands them over (or the text)."""
        try:
            return json.loads(self.text)
        except (ValueError, RecursionError):
            return self.text

    @property
    def is_object(self) -> bool:
        """Whether the text is a JSON object a framework's own parser accepts."""
        return isinstance(self.parsed, dict)


def _nested(levels: int) -> str:
    return '{"command": ' + "[" * levels + "]" * levels + "}"


HOSTILE = {
    "2 MB": Hostile("bash", json.dumps({"command": "echo " + "x" * (2 << 20)}), "at most"),
    "70 levels": Hostile("bash", _nested(70), "nested deeper than 64"),
    "200 levels": Hostile("bash", _nested(200), "nested deeper than 64"),
    "10000 levels": Hostile("bash", _nested(10_000), "nested deeper than 64"),
    "NUL": Hostile("bash", json.dumps({"command": "echo a\0b"}), "NUL character"),
    "lone surrogate": Hostile("bash", '{"command": "echo \\ud800"}', "lone surrogate"),
    "wrong type": Hostile("bash", '{"command": 5}', "is not of type 'string'"),
    "not an object": Hostile("bash", "[1, 2]", "must be a JSON object"),
    "missing field": Hostile("bash", "{}", "'command' is a required property"),
    "unknown field": Hostile("bash", '{"command": "true", "x": 1}', "'x' was unexpected"),
    "not JSON": Hostile("bash", "echo hi", "not valid JSON"),
    "huge number": Hostile("bash", '{"command": ' + "9" * 5000 + "}", "1000 digits"),
    "duplicate keys": Hostile("bash", '{"command": "echo one", "command": "echo two"}', None),
    "unknown tool": Hostile("nope", '{"command": "true"}', "there is no tool named 'nope'"),
    "2 MB name": Hostile("n" * (2 << 20), "{}", "there is no tool named 'nnnn"),
}


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory, backend: Sandbox) -> Iterator[av.Executor]:
    """``bash``, ``read`` and the reserved-names tool, in a real sandbox."""
    folder = tmp_path_factory.mktemp("doors") / "agent"
    (folder / "tools").mkdir(parents=True)
    (folder / "vessel.toml").write_text(
        'name = "doors"\n[tools]\nbuiltin = ["bash", "read"]\ndeclared = ["tools/reserved.toml"]\n'
    )
    (folder / "tools" / "reserved.toml").write_text(textwrap.dedent(RESERVED_TOOL))
    with av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend) as executor:
        yield executor


@pytest.fixture(scope="module")
def turn(executor: av.Executor) -> Iterator[av.Turn]:
    """One turn every hostile call of a module goes to: it must outlive them all."""
    with executor.turn() as turn:
        yield turn


def _alive(turn: av.Turn) -> None:
    result = turn.call("bash", {"command": "echo still here"})
    assert result.text.startswith("still here"), result.text


def _check(case: Hostile, text: str, failed: bool) -> None:
    """The model got an error it can act on, or (for a fine call) the call's output."""
    text.encode("utf-8")  # text any model API can carry
    if case.says is None:
        assert not failed, text
        assert text.startswith("two"), text
        return
    assert failed, text[:300]
    assert text.startswith("Error:"), text[:300]
    assert case.says in text, text[:300]
    assert len(text) < 2000  # never the hostile input echoed back whole


CASES = pytest.mark.parametrize("case", list(HOSTILE.values()), ids=list(HOSTILE))


# -- the loop adapters: plain dicts ---------------------------------------------------------


@CASES
def test_chat_completions_answers_each_with_a_tool_message(turn: av.Turn, case: Hostile) -> None:
    """Chat Completions: a tool message with the error's text, then the turn goes on."""
    response = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": case.tool, "arguments": case.text},
                        }
                    ],
                }
            }
        ]
    }
    (message,) = openai_adapter.run_chat_tool_calls(turn, response)
    assert message["tool_call_id"] == "c1"
    _check(case, message["content"], failed=message["content"].startswith("Error:"))
    _alive(turn)


@CASES
def test_responses_answers_each_with_a_function_call_output(turn: av.Turn, case: Hostile) -> None:
    """Responses: a function_call_output with the error's text, then the turn goes on."""
    item = {"type": "function_call", "call_id": "c1", "name": case.tool, "arguments": case.text}
    (output,) = asyncio.run(openai_adapter.arun_responses_tool_calls(turn, {"output": [item]}))
    assert output["call_id"] == "c1"
    _check(case, output["output"], failed=output["output"].startswith("Error:"))
    _alive(turn)


@CASES
def test_anthropic_answers_each_with_an_error_tool_result(turn: av.Turn, case: Hostile) -> None:
    """Messages: a tool_result block with is_error set, then the turn goes on."""
    block = {"type": "tool_use", "id": "t1", "name": case.tool, "input": case.parsed}
    message = anthropic_adapter.run_tool_calls(turn, {"content": [block]})
    (result,) = message["content"]
    assert result["tool_use_id"] == "t1"
    _check(case, result["content"], failed=result.get("is_error", False))
    _alive(turn)


@pytest.mark.parametrize(
    "response",
    [
        {"choices": ["text"]},
        {"choices": {"0": {}}},
        {"tool_calls": "bash"},
        {"tool_calls": [{"id": "c", "function": "bash"}]},
        {"tool_calls": [["bash", "{}"]]},
        "a response",
    ],
)
def test_a_chat_response_of_the_wrong_shape_is_the_hosts_error(response: object) -> None:
    """A Chat Completions response no API sends raises UsageError naming the part."""
    with pytest.raises(av.UsageError, match=r"expected .* as a"):
        openai_adapter.chat_tool_calls(response)


@pytest.mark.parametrize(
    "adapter",
    [anthropic_adapter.tool_calls, openai_adapter.responses_tool_calls],
    ids=["anthropic", "responses"],
)
@pytest.mark.parametrize(
    "response", [{"content": 5, "output": 5}, 7, {"content": [1], "output": [1]}]
)
def test_other_responses_of_the_wrong_shape_are_the_hosts_error(
    adapter: Any, response: object
) -> None:
    """A Messages or Responses response no API sends raises UsageError."""
    with pytest.raises(av.UsageError):
        adapter(response)


@BUDGET
@given(name=st.sampled_from(["bash", "read", "reserved", "nope", ""]), text=RAW_ARGUMENTS)
def test_any_arguments_through_chat_completions_give_a_tool_message(
    turn: av.Turn, name: str, text: object
) -> None:
    """Any arguments text under any tool name comes back as a tool message of plain text."""
    arguments = text.decode("latin-1") if isinstance(text, bytes) else text
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
    (message,) = openai_adapter.run_chat_tool_calls(turn, {"tool_calls": [call]})
    assert isinstance(message["content"], str)
    message["content"].encode("utf-8")
    _alive(turn)


# -- LangChain ------------------------------------------------------------------------------

# A LangChain chat model parses a call's arguments itself; text that is not a JSON object
# goes to the message's invalid_tool_calls and never reaches a tool.
PARSED = [case for case in HOSTILE.values() if case.is_object and case.tool == "bash"]


@pytest.mark.parametrize("case", PARSED, ids=[k for k, c in HOSTILE.items() if c in PARSED])
def test_langchain_answers_each_with_an_error_tool_message(turn: av.Turn, case: Hostile) -> None:
    """A LangChain tool call answers with a ToolMessage of status "error"; the turn goes on."""
    (bash,) = [tool for tool in structured_tools(turn) if tool.name == "bash"]
    call = {"type": "tool_call", "id": "c1", "name": "bash", "args": case.parsed}
    message = bash.invoke(call)
    assert isinstance(message, ToolMessage)
    _check(case, str(message.content), failed=message.status == "error")
    _alive(turn)


@pytest.mark.parametrize("name", ["callbacks", "config", "run_manager"])
def test_langchain_keeps_arguments_named_like_its_own(turn: av.Turn, name: str) -> None:
    """An argument LangChain's names (callbacks, config, run_manager) reaches the tool's schema:
    refused where the schema has no such property, delivered where it has."""
    tools = {tool.name: tool for tool in structured_tools(turn)}
    args = {"command": "echo hi", name: "from the model"}
    refused = tools["bash"].invoke({"type": "tool_call", "id": "c1", "name": "bash", "args": args})
    assert refused.status == "error"
    assert f"'{name}' was unexpected" in refused.content
    given_args = {"type": "tool_call", "id": "c2", "name": "reserved", "args": {name: "kept"}}
    delivered = tools["reserved"].invoke(given_args)
    assert delivered.status == "success", delivered.content
    assert json.loads(delivered.content) == {name: "kept"}


# -- OpenAI Agents SDK ----------------------------------------------------------------------


class _OneCall(Model):
    """Asks for one tool call of the given name and arguments text, then ends the run with
    what the call returned."""

    def __init__(self, name: str, arguments: str) -> None:
        self.call: tuple[str, str] | None = (name, arguments)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The call first; then a final message holding the call's output."""
        if self.call is not None:
            name, arguments = self.call
            self.call = None
            call = ResponseFunctionToolCall(
                type="function_call", call_id="c1", name=name, arguments=arguments
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        (output,) = [
            i["output"] for i in kwargs["input"] if i.get("type") == "function_call_output"
        ]
        message = ResponseOutputMessage.model_validate(
            {
                "id": "m",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": output, "annotations": []}],
            }
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        """Not used: the runner is not asked to stream."""
        raise NotImplementedError


#: What the Agents SDK (0.24) does itself before any tool of ours is called.
_SDK_FIRST = {
    "10000 levels": "the SDK parses the arguments to deduplicate calls and its json.loads "
    "raises RecursionError out of Runner.run",
    "lone surrogate": "the SDK fingerprints the parsed arguments as UTF-8 to deduplicate "
    "calls and raises UnicodeEncodeError out of Runner.run",
    "unknown tool": "the SDK looks the tool up itself and raises ModelBehaviorError",
    "2 MB name": "the SDK looks the tool up itself and raises ModelBehaviorError",
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=_SDK_FIRST[key]))
        if key in _SDK_FIRST
        else case
        for key, case in HOSTILE.items()
    ],
    ids=list(HOSTILE),
)
def test_agents_run_goes_on_after_each(executor: av.Executor, case: Hostile) -> None:
    """Through ``Runner.run``, the model gets the error text as the call's output and the run
    ends normally in the host's turn, which goes on."""
    agent = AgentsAgent(
        name="doors", model=_OneCall(case.tool, case.text), tools=function_tools(executor)
    )

    async def main() -> str:
        async with executor.turn() as turn:
            result = await Runner.run(
                agent, "go", context=turn, run_config=RunConfig(tracing_disabled=True)
            )
            await asyncio.to_thread(_alive, turn)
            return str(result.final_output)

    text = asyncio.run(main())
    _check(case, text, failed=text.startswith("Error:"))


# -- pydantic-ai ----------------------------------------------------------------------------


def _one_call(name: str, arguments: str | dict[str, Any]) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
        if len(messages) == 1:
            return PydanticResponse(parts=[ToolCallPart(name, arguments, tool_call_id="c1")])
        return PydanticResponse(parts=[TextPart("done")])

    return FunctionModel(model)


def _answers(messages: list[ModelMessage]) -> list[ToolReturnPart | RetryPromptPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, (ToolReturnPart, RetryPromptPart))
    ]


@pytest.mark.parametrize(
    "case",
    [case for case in HOSTILE.values() if case.tool == "bash"],
    ids=[key for key, case in HOSTILE.items() if case.tool == "bash"],
)
def test_pydantic_ai_answers_each_with_a_failed_tool_return(
    executor: av.Executor, case: Hostile
) -> None:
    """Arguments as text, however broken, reach the turn and come back as a failed tool
    return; the run ends normally (pydantic-ai does not spend the tool's retries)."""
    agent = PydanticAgent(_one_call(case.tool, case.text), toolsets=[VesselToolset(executor)])
    result = asyncio.run(agent.run("go"))
    (answer,) = _answers(result.all_messages())
    assert isinstance(answer, ToolReturnPart)
    assert result.output == "done"
    _check(case, str(answer.content), failed=answer.outcome == "failed")


def test_pydantic_ai_unknown_tool_is_its_own_retry_prompt(executor: av.Executor) -> None:
    """pydantic-ai answers a call to a tool no toolset has itself, naming the tools; the run
    goes on."""
    agent = PydanticAgent(_one_call("nope", "{}"), toolsets=[VesselToolset(executor)])
    result = asyncio.run(agent.run("go"))
    (answer,) = _answers(result.all_messages())
    assert "nope" in str(answer.content)
    assert "bash" in str(answer.content)
    assert result.output == "done"
