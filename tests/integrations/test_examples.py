"""The example loops in ``examples/loops`` run offline, end to end, against a real sandbox."""

from __future__ import annotations

import json
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import BACKEND

LOOPS = Path(__file__).resolve().parents[2] / "examples" / "loops"
FRAMEWORKS = LOOPS.parent / "frameworks"

#: Runs one example as ``python SCRIPT --backend BACKEND``: what it printed.
RunScript = Callable[[Path], str]
#: Runs one of ``examples/loops`` the same way: the JSON lines it printed.
RunLoop = Callable[[str], list[dict[str, Any]]]


@pytest.fixture
def run_script(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> RunScript:
    """Run an example script as ``__main__`` in this process, its folder first on sys.path as
    ``python SCRIPT`` puts it; an error it raises fails the test with its traceback.

    In this process, not a new interpreter: the frameworks' imports (the Agents SDK's alone
    took 35 s at load 20) are made once, by test_frameworks.py, not once per example.
    """

    def run(script: Path) -> str:
        monkeypatch.setattr(sys, "argv", [str(script), "--backend", BACKEND])
        monkeypatch.syspath_prepend(str(script.parent))
        capsys.readouterr()
        runpy.run_path(str(script), run_name="__main__")
        return capsys.readouterr().out

    return run


@pytest.fixture
def run_loop(run_script: RunScript) -> RunLoop:
    """Run one of ``examples/loops``: the JSON lines it printed."""

    def run(script: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in run_script(LOOPS / script).splitlines()]

    return run


def test_openai_chat_loop(run_loop: RunLoop) -> None:
    """The Chat Completions loop answers both calls of one response with tool messages."""
    messages = run_loop("openai_chat.py")
    tools = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_species", "call_words"]
    assert "Eurasian otter" in tools[0]["content"]
    assert tools[1]["content"].strip() == "species/otter.md: 39 words"
    assert messages[-1]["content"].startswith("Beavers")


def test_openai_responses_loop(run_loop: RunLoop) -> None:
    """The async Responses loop adds one function_call_output per function call."""
    items = run_loop("openai_responses.py")
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_species", "call_grep"]
    assert "Pied avocet" in outputs[0]["output"]
    assert outputs[1]["output"].startswith("species/otter.md:")
    assert items[-1]["type"] == "message"


def test_anthropic_messages_loop(run_loop: RunLoop) -> None:
    """The Messages loop returns one user message of results, the model's mistake flagged."""
    messages = run_loop("anthropic_messages.py")
    results = messages[2]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2"]
    assert "Eurasian otter" in results[0]["content"]
    assert results[1]["is_error"] is True
    assert "'verbose'" in results[1]["content"]
    assert messages[-1]["role"] == "assistant"


@pytest.mark.parametrize(
    "script", ["openai_chat.py", "openai_responses.py", "anthropic_messages.py"]
)
def test_example_needs_no_vendor_sdk(script: str) -> None:
    """No example imports a vendor SDK: the adapters work on plain dicts."""
    source = (LOOPS / script).read_text()
    assert "import openai" not in source
    assert "import anthropic" not in source


def test_agents_sdk_example(run_script: RunScript) -> None:
    """The Agents SDK example's run answers with what the sandboxed ``species`` tool printed."""
    assert "Pied avocet" in run_script(FRAMEWORKS / "agents_sdk_run.py")


def test_pydantic_ai_example(run_script: RunScript) -> None:
    """The pydantic-ai example's run gets the tool's text and a failed result for the bad read."""
    output = run_script(FRAMEWORKS / "pydantic_ai_run.py")
    assert "Pied avocet" in output
    assert output.rstrip().endswith("(failed)")


def test_langchain_example(run_script: RunScript) -> None:
    """The LangChain example gets a success ToolMessage and an error one for the bad argument."""
    lines = run_script(FRAMEWORKS / "langchain_run.py").splitlines()
    assert lines[0] == "call_1 [success]: ["
    assert lines[-1].startswith("call_2 [error]: Error: invalid arguments for grep")


def test_agents_sdk_sandbox_example(run_script: RunScript) -> None:
    """The SandboxAgent example writes a script, runs it and answers with what it printed."""
    lines = run_script(FRAMEWORKS / "agents_sdk_sandbox.py").splitlines()
    assert lines == ["45", "The sum is 45."]
