"""The example loops in ``examples/loops`` run offline, end to end, against a real sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import BACKEND

LOOPS = Path(__file__).resolve().parents[2] / "examples" / "loops"


def _run(script: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(LOOPS / script), "--backend", BACKEND],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_openai_chat_loop() -> None:
    """The Chat Completions loop answers both calls of one response with tool messages."""
    messages = _run("openai_chat.py")
    tools = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_species", "call_words"]
    assert "Eurasian otter" in tools[0]["content"]
    assert tools[1]["content"].strip() == "species/otter.md: 39 words"
    assert messages[-1]["content"].startswith("Beavers")


def test_openai_responses_loop() -> None:
    """The async Responses loop adds one function_call_output per function call."""
    items = _run("openai_responses.py")
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_species", "call_grep"]
    assert "Pied avocet" in outputs[0]["output"]
    assert outputs[1]["output"].startswith("species/otter.md:")
    assert items[-1]["type"] == "message"


def test_anthropic_messages_loop() -> None:
    """The Messages loop returns one user message of results, the model's mistake flagged."""
    messages = _run("anthropic_messages.py")
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


FRAMEWORKS = LOOPS.parent / "frameworks"


def _run_text(script: str) -> str:
    done = subprocess.run(
        [sys.executable, str(FRAMEWORKS / script), "--backend", BACKEND],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_agents_sdk_example() -> None:
    """The Agents SDK example's run answers with what the sandboxed ``species`` tool printed."""
    assert "Pied avocet" in _run_text("agents_sdk_run.py")


def test_pydantic_ai_example() -> None:
    """The pydantic-ai example's run gets the tool's text and a failed result for the bad read."""
    output = _run_text("pydantic_ai_run.py")
    assert "Pied avocet" in output
    assert output.rstrip().endswith("(failed)")


def test_langchain_example() -> None:
    """The LangChain example gets a success ToolMessage and an error one for the bad argument."""
    lines = _run_text("langchain_run.py").splitlines()
    assert lines[0] == "call_1 [success]: ["
    assert lines[-1].startswith("call_2 [error]: Error: invalid arguments for grep")
