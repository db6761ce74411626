"""Outbox files in adapter results: images and documents where the API takes them, notes otherwise."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionToolMessageParam
from openai.types.responses import ResponseInputItemParam

import astralvessel as av
from astralvessel.adapters import MediaBudget
from astralvessel.adapters import anthropic as anthropic_adapter
from astralvessel.adapters import openai as openai_adapter
from astralvessel.sandbox._base import Sandbox

from ..conftest import MakeAgent
from .test_sdk_types import sdk_validate

#: A 1x1 PNG.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

DRAW_TOOL = f"""
name = "draw"
description = "Leave an image, a PDF, a text file, a binary blob and a large image in the outbox."
command = ["python3", "-c", '''
import base64, os
out = os.environ["VESSEL_OUTBOX"]
open(f"{{out}}/dot.png", "wb").write(base64.b64decode("{PNG}"))
open(f"{{out}}/report.pdf", "wb").write(b"%PDF-1.4\\n%%EOF\\n")
open(f"{{out}}/notes.txt", "w").write("otters: 3\\n")
open(f"{{out}}/blob.bin", "wb").write(bytes(range(256)))
open(f"{{out}}/huge.png", "wb").write(b"\\0" * 3000)
print("drawn")
''']
"""


@pytest.fixture
def executor(make_agent: MakeAgent, backend: Sandbox) -> av.Executor:
    """A sandboxed ``draw`` tool that leaves five files in its outbox."""
    folder = make_agent('[tools]\ndeclared = ["tools/draw.toml"]\n', {"tools/draw.toml": DRAW_TOOL})
    return av.Executor(av.Registry.for_agent(av.Agent.load(folder)), sandbox=backend)


#: Small enough that huge.png (3000 bytes) stays out.
BUDGET = MediaBudget(max_file_bytes=2000)

ANTHROPIC_CALL = {"content": [{"type": "tool_use", "id": "t1", "name": "draw", "input": {}}]}
RESPONSES_CALL = {
    "output": [{"type": "function_call", "call_id": "c1", "name": "draw", "arguments": "{}"}]
}
CHAT_CALL = {
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "draw", "arguments": "{}"}}
    ]
}


def test_anthropic_gets_image_and_document_blocks(executor: av.Executor) -> None:
    """The PNG is an image block, the PDF and text file documents; the rest are named in the text."""
    with executor.turn() as turn:
        message = anthropic_adapter.run_tool_calls(turn, ANTHROPIC_CALL, budget=BUDGET)
    sdk_validate(MessageParam, message)
    (result,) = message["content"]
    text, *blocks = result["content"]
    assert text["type"] == "text"
    assert text["text"].startswith("drawn\n")
    assert "blob.bin (256 bytes) not attached" in text["text"]
    assert "huge.png (3000 bytes) not attached: larger than the 2000 bytes" in text["text"]
    kinds = sorted((b["type"], b["source"]["type"], b["source"]["media_type"]) for b in blocks)
    assert kinds == [
        ("document", "base64", "application/pdf"),
        ("document", "text", "text/plain"),
        ("image", "base64", "image/png"),
    ]
    (image,) = [b for b in blocks if b["type"] == "image"]
    assert image["source"]["data"] == PNG


def test_responses_gets_input_image_and_input_file(executor: av.Executor) -> None:
    """The PNG is an input_image data URL, the PDF an input_file; the text file is named."""
    with executor.turn() as turn:
        (item,) = openai_adapter.run_responses_tool_calls(turn, RESPONSES_CALL, budget=BUDGET)
    sdk_validate(ResponseInputItemParam, item)
    text, *rest = item["output"]
    assert text["type"] == "input_text"
    assert (
        "notes.txt (10 bytes) not attached: the Responses API takes no text/plain" in text["text"]
    )
    by_type = {part["type"]: part for part in rest}
    assert by_type["input_image"]["image_url"] == f"data:image/png;base64,{PNG}"
    assert by_type["input_file"]["filename"] == "report.pdf"
    assert by_type["input_file"]["file_data"].startswith("data:application/pdf;base64,")


def test_chat_names_every_file_in_the_text(executor: av.Executor) -> None:
    """Chat tool messages take only text: each file is named, with why it is not attached."""
    with executor.turn() as turn:
        (message,) = openai_adapter.run_chat_tool_calls(turn, CHAT_CALL)
    sdk_validate(ChatCompletionToolMessageParam, message)
    lines = message["content"].splitlines()
    assert lines[0] == "drawn"
    assert len(lines) == 6
    assert all("takes no" in line for line in lines[1:])


def test_text_only_budget_attaches_nothing(executor: av.Executor) -> None:
    """``MediaBudget.text_only()`` keeps the content a string that names every file."""
    with executor.turn() as turn:
        message = anthropic_adapter.run_tool_calls(
            turn, ANTHROPIC_CALL, budget=MediaBudget.text_only()
        )
    content: Any = message["content"][0]["content"]
    assert isinstance(content, str)
    assert content.count("not attached: the host attaches no files") == 4


def test_budget_values_are_checked() -> None:
    """A budget with a non-positive byte limit cannot be built."""
    with pytest.raises(ValueError, match="max_file_bytes"):
        MediaBudget(max_file_bytes=0)
