"""Agent frameworks: a tool call through each framework's own invocation path into a real sandbox."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent as AgentsAgent
from agents import FunctionTool, ItemHelpers, ModelResponse, RunConfig, Runner
from agents.exceptions import UserError
from agents.models.interface import Model
from agents.tool_context import ToolContext
from agents.usage import Usage
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.messages import ModelResponse as PydanticResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

import astralvessel as av
from astralvessel.errors import TurnClosedError
from astralvessel.integrations._common import RunTurns
from astralvessel.integrations.langchain import TurnPerRun, structured_tools
from astralvessel.integrations.openai_agents import function_tools
from astralvessel.integrations.pydantic_ai import VesselToolset
from astralvessel.sandbox._base import Sandbox

from ..conftest import MakeAgent
from .test_media import DRAW_TOOL

ECHO_TOOL = """
name = "echo"
description = "Echo the arguments back."
command = ["python3", "-c", "import sys; print(sys.stdin.read(), end='')"]
[parameters]
type = "object"
properties = { q = { type = "string" } }
required = ["q"]
additionalProperties = false
"""

#: Writes a file into the workspace; a later call of the same turn can read it back.
WRITE = {"command": "echo kept > $HOME/note.txt && echo written"}
READ_BACK = {"command": "cat $HOME/note.txt"}


@pytest.fixture
def executor(make_agent: MakeAgent, backend: Sandbox) -> av.Executor:
    """A sandboxed ``echo`` tool and ``bash``, in a real bubblewrap sandbox."""
    folder = make_agent(
        '[tools]\nbuiltin = ["bash", "read"]\ndeclared = ["tools/echo.toml"]\n',
        {"tools/echo.toml": ECHO_TOOL},
    )
    return av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)


# -- OpenAI Agents SDK ----------------------------------------------------------------------


def _context(usage: Usage, name: str, arguments: str) -> ToolContext[None]:
    return ToolContext(
        context=None, usage=usage, tool_name=name, tool_call_id="c", tool_arguments=arguments
    )


async def _invoke(tools: list[FunctionTool], usage: Usage, name: str, args: object) -> Any:
    (tool,) = [t for t in tools if t.name == name]
    arguments = json.dumps(args)
    return await tool.on_invoke_tool(_context(usage, name, arguments), arguments)


def test_agents_function_tool_runs_in_the_sandbox(executor: av.Executor) -> None:
    """``FunctionTool.on_invoke_tool`` runs the declared tool in the sandbox and returns its text."""
    tools = function_tools(executor)
    assert [t.name for t in tools] == ["bash", "read", "echo"]
    assert asyncio.run(_invoke(tools, Usage(), "echo", {"q": "otter"})) == '{"q": "otter"}'


def test_agents_strict_only_where_the_schema_allows(executor: av.Executor) -> None:
    """echo and bash take exactly their required arguments, so they are strict; read is not."""
    strict = {t.name: t.strict_json_schema for t in function_tools(executor)}
    assert strict == {"bash": True, "read": False, "echo": True}


def test_agents_errors_go_back_to_the_model_as_text(executor: av.Executor) -> None:
    """A refused call returns its error text, the SDK's way of telling the model, and raises nothing."""
    text = asyncio.run(_invoke(function_tools(executor), Usage(), "echo", {"q": 1}))
    assert text.startswith("Error: invalid arguments for echo")


def test_agents_calls_of_one_run_share_a_turn(executor: av.Executor) -> None:
    """Calls with the same run usage share a workspace; another run starts in a fresh one."""
    tools = function_tools(executor)

    async def main() -> tuple[str, str]:
        run, other = Usage(), Usage()
        await _invoke(tools, run, "bash", WRITE)
        return (
            await _invoke(tools, run, "bash", READ_BACK),
            await _invoke(tools, other, "bash", READ_BACK),
        )

    same, fresh = asyncio.run(main())
    assert same.startswith("kept")
    assert "No such file" in fresh


class _ScriptedModel(Model):
    """A model that asks for two bash calls in turn, then answers with their outputs."""

    def __init__(self) -> None:
        self.calls = [WRITE, READ_BACK]

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The next scripted tool call, or a final message once they are done."""
        if self.calls:
            arguments = json.dumps(self.calls.pop(0))
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"c{len(self.calls)}",
                name="bash",
                arguments=arguments,
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        outputs = [i["output"] for i in kwargs["input"] if i.get("type") == "function_call_output"]
        message = ResponseOutputMessage.model_validate(
            {
                "id": "m",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": outputs[-1], "annotations": []}],
            }
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Not used: the runner is not asked to stream."""
        raise NotImplementedError


def test_agents_runner_run_keeps_one_workspace(executor: av.Executor) -> None:
    """Through ``Runner.run``, a file one call writes is there for the run's next call."""
    agent = AgentsAgent(name="guide", model=_ScriptedModel(), tools=function_tools(executor))
    result = asyncio.run(
        Runner.run(agent, "write then read", run_config=RunConfig(tracing_disabled=True))
    )
    assert result.final_output.startswith("kept")


def _run(agent: AgentsAgent[Any], context: object = None) -> Any:
    return Runner.run(
        agent, "write then read", context=context, run_config=RunConfig(tracing_disabled=True)
    )


def test_agents_run_in_the_turn_its_context_holds(executor: av.Executor) -> None:
    """``Runner.run(context=turn)``: the run's calls run in the host's turn, closed with it."""
    agent = AgentsAgent(name="guide", model=_ScriptedModel(), tools=function_tools(executor))

    async def main() -> tuple[str, av.ToolResult, av.Turn]:
        async with executor.turn() as turn:
            result = await _run(agent, context=turn)
            # The run wrote in the host's turn: the host reads its file after the run.
            return result.final_output, await turn.acall("bash", READ_BACK), turn

    final, after, turn = asyncio.run(main())
    assert final.startswith("kept")
    assert after.text.startswith("kept")
    with pytest.raises(TurnClosedError):
        turn.call("echo", {"q": "late"})


class _Deps:
    """A host's own run context, carrying the turn beside its other dependencies."""

    def __init__(self, turn: av.Turn) -> None:
        self.vessel_turn = turn
        self.user = "ranger"


def test_agents_context_may_carry_the_turn_beside_other_things(executor: av.Executor) -> None:
    """A context object with a ``vessel_turn`` attribute hands the run that turn."""
    agent = AgentsAgent(name="guide", model=_ScriptedModel(), tools=function_tools(executor))

    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            await _run(agent, context=_Deps(turn))
            return await turn.acall("bash", READ_BACK)

    assert asyncio.run(main()).text.startswith("kept")


class _BrokenModel(_ScriptedModel):
    """Asks for one long call, or fails right after the first call."""

    def __init__(self, first: dict[str, Any], *, fail: bool) -> None:
        super().__init__()
        self.calls, self.fail = [first], fail

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The scripted call, then an outage if ``fail``."""
        if not self.calls and self.fail:
            raise ConnectionError("the model went away")
        return await super().get_response(*args, **kwargs)


def test_agents_failed_run_ends_its_turn(executor: av.Executor) -> None:
    """A run that fails after a call leaves the host's ``async with``, which closes the turn."""
    model = _BrokenModel(WRITE, fail=True)
    agent = AgentsAgent(name="guide", model=model, tools=function_tools(executor))
    held: list[av.Turn] = []

    async def main() -> None:
        async with executor.turn() as turn:
            held.append(turn)
            await _run(agent, context=turn)

    with pytest.raises(ConnectionError, match="went away"):
        asyncio.run(main())
    with pytest.raises(TurnClosedError):
        held[0].call("echo", {"q": "late"})


def test_agents_cancelled_run_kills_its_call_and_ends_its_turn(executor: av.Executor) -> None:
    """Cancelling ``Runner.run`` mid-call kills the call in the sandbox and closes the turn."""
    marker = f"sleep 79.{os.getpid()}"
    model = _BrokenModel({"command": marker}, fail=False)
    agent = AgentsAgent(name="guide", model=model, tools=function_tools(executor))
    held: list[av.Turn] = []

    async def run() -> None:
        async with executor.turn() as turn:
            held.append(turn)
            await _run(agent, context=turn)

    async def main() -> None:
        task = asyncio.ensure_future(run())
        while not _running(marker):  # the call has started in the sandbox
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not _running(marker)
    with pytest.raises(TurnClosedError):
        held[0].call("echo", {"q": "late"})


def test_agents_turn_of_another_executor_is_the_hosts_error(
    executor: av.Executor, backend: Sandbox
) -> None:
    """A context turn from an executor other than the tools' raises UsageError (as the SDK's cause)."""
    other = av.Executor(av.Registry(), sandbox=backend)
    agent = AgentsAgent(name="guide", model=_ScriptedModel(), tools=function_tools(executor))

    async def main() -> None:
        async with other.turn() as turn:
            await _run(agent, context=turn)

    with pytest.raises(UserError, match="another executor") as raised:
        asyncio.run(main())
    assert isinstance(raised.value.__cause__, av.UsageError)


def test_run_turns_end_when_the_run_is_released(executor: av.Executor) -> None:
    """A run's turn ends when the object that keys it is garbage collected."""
    turns = RunTurns(executor)
    owner = Usage()
    turn = turns.turn_for(owner)
    assert turns.turn_for(owner) is turn
    del owner
    gc.collect()
    assert len(turns) == 0
    with pytest.raises(TurnClosedError):
        turn.call("echo", {"q": "late"}).text  # noqa: B018 - the call itself must raise


# -- pydantic-ai ----------------------------------------------------------------------------


def _two_steps(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
    """Write a file, then read it back and fail a call in the same step, then finish."""
    if len(messages) == 1:
        return PydanticResponse(parts=[ToolCallPart("bash", WRITE)])
    if len(messages) == 3:
        return PydanticResponse(
            parts=[ToolCallPart("bash", READ_BACK), ToolCallPart("echo", {"q": 1})]
        )
    return PydanticResponse(parts=[TextPart("done")])


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def test_pydantic_ai_run_keeps_one_workspace_and_fails_calls(executor: av.Executor) -> None:
    """Through ``Agent.run``: one turn per run, and a failed call is a failed tool return."""
    toolset = VesselToolset(executor)
    first = asyncio.run(PydanticAgent(FunctionModel(_two_steps), toolsets=[toolset]).run("go"))
    written, read_back, refused = _returns(first.all_messages())
    assert written.content.startswith("written")
    assert read_back.content.startswith("kept")
    assert refused.outcome == "failed"
    assert "invalid arguments for echo" in str(refused.content)


def _read_back(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
    """Read the file back, then finish."""
    if len(messages) == 1:
        return PydanticResponse(parts=[ToolCallPart("bash", READ_BACK)])
    return PydanticResponse(parts=[TextPart("done")])


def test_pydantic_ai_each_run_gets_a_fresh_turn(executor: av.Executor) -> None:
    """Two runs with one toolset: the second does not see what the first wrote."""
    toolset = VesselToolset(executor)
    asyncio.run(PydanticAgent(FunctionModel(_two_steps), toolsets=[toolset]).run("go"))
    second = asyncio.run(PydanticAgent(FunctionModel(_read_back), toolsets=[toolset]).run("go"))
    (read_back,) = _returns(second.all_messages())
    assert "No such file" in str(read_back.content)


def test_pydantic_ai_toolset_lists_the_granted_tools(executor: av.Executor) -> None:
    """The model is offered the executor's tools with their own schemas."""
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
        seen.extend(tool.name for tool in info.function_tools)
        return PydanticResponse(parts=[TextPart("done")])

    asyncio.run(PydanticAgent(FunctionModel(model), toolsets=[VesselToolset(executor)]).run("go"))
    assert seen == ["bash", "read", "echo"]


# -- LangChain ------------------------------------------------------------------------------


def _tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": "call_1", "name": name, "args": args}


def test_langchain_invoke_runs_in_the_turn(executor: av.Executor) -> None:
    """``StructuredTool.invoke`` runs in the turn's sandbox; calls share its workspace."""
    with executor.turn() as turn:
        tools = {t.name: t for t in structured_tools(turn)}
        assert tools["echo"].invoke({"q": "vole"}) == '{"q": "vole"}'
        tools["bash"].invoke(WRITE)
        message = tools["bash"].invoke(_tool_call("bash", READ_BACK))
    assert isinstance(message, ToolMessage)
    assert message.content.startswith("kept")
    assert message.status == "success"


def test_langchain_errors_are_error_tool_messages(executor: av.Executor) -> None:
    """A failing call becomes a ToolMessage with status "error" and the error text."""
    with executor.turn() as turn:
        (echo,) = [t for t in structured_tools(turn) if t.name == "echo"]
        message = echo.invoke(_tool_call("echo", {"q": 1}))
    assert message.status == "error"
    assert message.content.startswith("Error: invalid arguments for echo")


def test_langchain_ainvoke_awaits_the_call(executor: av.Executor) -> None:
    """``ainvoke`` runs the call with the turn's ``acall``."""

    async def main() -> Any:
        async with executor.turn() as turn:
            (echo,) = [t for t in structured_tools(turn) if t.name == "echo"]
            return await echo.ainvoke(_tool_call("echo", {"q": "eel"}))

    assert asyncio.run(main()).content == '{"q": "eel"}'


def test_agents_outbox_files_become_image_and_file_outputs(
    make_agent: MakeAgent, backend: Sandbox
) -> None:
    """Outbox images and PDFs reach the SDK as its image and file outputs; it turns them into items."""
    folder = make_agent('[tools]\ndeclared = ["tools/draw.toml"]\n', {"tools/draw.toml": DRAW_TOOL})
    executor = av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)
    output = asyncio.run(_invoke(function_tools(executor), Usage(), "draw", {}))
    text, *files = output
    assert text["text"].startswith("drawn\n")
    assert "notes.txt (10 bytes) not attached" in text["text"]
    assert sorted(f["type"] for f in files) == ["file", "image", "image"]
    call = ResponseFunctionToolCall(type="function_call", call_id="c", name="draw", arguments="{}")
    item = ItemHelpers.tool_call_output_item(call, output)
    assert sorted(part["type"] for part in item["output"]) == [
        "input_file",
        "input_image",
        "input_image",
        "input_text",
    ]


def test_pydantic_ai_outbox_files_become_binary_content(
    make_agent: MakeAgent, backend: Sandbox
) -> None:
    """Outbox images and PDFs reach the model as pydantic-ai BinaryContent after the text."""
    folder = make_agent('[tools]\ndeclared = ["tools/draw.toml"]\n', {"tools/draw.toml": DRAW_TOOL})
    executor = av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)
    seen: list[ModelMessage] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
        if len(messages) == 1:
            return PydanticResponse(parts=[ToolCallPart("draw", {})])
        seen.extend(messages)
        return PydanticResponse(parts=[TextPart("done")])

    asyncio.run(PydanticAgent(FunctionModel(model), toolsets=[VesselToolset(executor)]).run("go"))
    binaries = [
        item
        for message in seen
        if isinstance(message, ModelRequest)
        for part in message.parts
        for item in (part.content if isinstance(part.content, list) else [part.content])
        if isinstance(item, BinaryContent)
    ]
    assert sorted(b.media_type for b in binaries) == ["application/pdf", "image/png", "image/png"]


def test_langchain_outbox_files_become_content_blocks(
    make_agent: MakeAgent, backend: Sandbox
) -> None:
    """Outbox images and PDFs reach the ToolMessage as image and file content blocks."""
    folder = make_agent('[tools]\ndeclared = ["tools/draw.toml"]\n', {"tools/draw.toml": DRAW_TOOL})
    executor = av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)
    with executor.turn() as turn:
        (draw,) = structured_tools(turn)
        message = draw.invoke(_tool_call("draw", {}))
    text, *blocks = message.content
    assert text["text"].startswith("drawn\n")
    assert "notes.txt (10 bytes) not attached" in text["text"]
    assert sorted((b["type"], b["mime_type"]) for b in blocks) == [
        ("file", "application/pdf"),
        ("image", "image/png"),
        ("image", "image/png"),
    ]


def _chain(turns: TurnPerRun, *calls: dict[str, Any], fail: bool = False) -> Runnable[Any, Any]:
    """A LangChain agent step: a chat model asks for ``calls``, a runnable runs them in order."""
    tool_calls = [
        {"type": "tool_call", "id": f"call_{i}", "name": "bash", "args": args}
        for i, args in enumerate(calls)
    ]
    model = FakeMessagesListChatModel(responses=[AIMessage(content="", tool_calls=tool_calls)])
    tools = {tool.name: tool for tool in turns.tools()}

    def run(message: AIMessage, config: RunnableConfig) -> list[ToolMessage]:
        done = [tools[call["name"]].invoke(call, config) for call in message.tool_calls]
        if fail:
            raise RuntimeError("the agent broke after its calls")
        return done

    async def arun(message: AIMessage, config: RunnableConfig) -> list[ToolMessage]:
        return [await tools[call["name"]].ainvoke(call, config) for call in message.tool_calls]

    return model | RunnableLambda(run, afunc=arun)


def _recording(executor: av.Executor, monkeypatch: pytest.MonkeyPatch) -> list[av.Turn]:
    """Every turn the executor opens from now on, in order."""
    opened: list[av.Turn] = []
    open_turn = executor.turn

    def turn() -> av.Turn:
        opened.append(open_turn())
        return opened[-1]

    monkeypatch.setattr(executor, "turn", turn)
    return opened


def test_langchain_run_gets_its_own_turn(
    executor: av.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a chain's ``invoke``, a run's calls share one turn, closed when the run ends."""
    opened = _recording(executor, monkeypatch)
    turns = TurnPerRun(executor)
    config: RunnableConfig = {"callbacks": [turns]}
    write, read = _chain(turns, WRITE, READ_BACK).invoke("go", config)
    assert write.content.startswith("written")
    assert read.content.startswith("kept")
    (fresh,) = _chain(turns, READ_BACK).invoke("again", config)
    assert "No such file" in fresh.content  # the next run starts in a fresh workspace
    assert len(opened) == 2
    assert len(turns) == 0
    with pytest.raises(TurnClosedError):
        opened[0].call("echo", {"q": "late"})


def test_langchain_concurrent_runs_do_not_share_a_turn(executor: av.Executor) -> None:
    """``batch`` runs three runs at once; each counts only its own two calls."""
    count = {"command": "echo x >> $HOME/calls && wc -l < $HOME/calls"}
    turns = TurnPerRun(executor)
    runs = _chain(turns, count, count).batch(
        ["a", "b", "c"], {"callbacks": [turns], "max_concurrency": 3}
    )
    assert [[m.content.split()[0] for m in messages] for messages in runs] == [["1", "2"]] * 3
    assert len(turns) == 0


def test_langchain_failed_run_closes_its_turn(
    executor: av.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that raises after its calls still closes its turn."""
    opened = _recording(executor, monkeypatch)
    turns = TurnPerRun(executor)
    with pytest.raises(RuntimeError, match="broke"):
        _chain(turns, WRITE, fail=True).invoke("go", {"callbacks": [turns]})
    assert len(turns) == 0
    with pytest.raises(TurnClosedError):
        opened[0].call("echo", {"q": "late"})


def test_langchain_cancelled_ainvoke_kills_the_call_and_closes_the_turn(
    executor: av.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling an ``ainvoke`` mid-call kills the call in the sandbox and closes the turn."""
    opened = _recording(executor, monkeypatch)
    turns = TurnPerRun(executor)
    marker = f"sleep 83.{os.getpid()}"

    async def main() -> None:
        chain = _chain(turns, {"command": marker})
        task = asyncio.ensure_future(chain.ainvoke("go", {"callbacks": [turns]}))
        while not _running(marker):  # the call has started in the sandbox
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(turns) == 0
    assert not _running(marker)
    with pytest.raises(TurnClosedError):
        opened[0].call("echo", {"q": "late"})


def test_langchain_tool_outside_its_run_is_the_hosts_error(executor: av.Executor) -> None:
    """A TurnPerRun tool invoked without the handler in its run's callbacks raises UsageError."""
    (echo,) = [t for t in TurnPerRun(executor).tools() if t.name == "echo"]
    with pytest.raises(av.UsageError, match="callbacks"):
        echo.invoke({"q": "stray"})


def _running(pattern: str) -> bool:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False)
    return found.returncode == 0
