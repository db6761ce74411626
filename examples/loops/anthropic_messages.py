"""A complete Anthropic Messages tool loop, run offline against a scripted model.

Run it from the repository root:

    python examples/loops/anthropic_messages.py [--backend bubblewrap]

To use the real API, replace ``ScriptedMessagesModel`` with a function that
calls ``client.messages.create(model=..., max_tokens=..., messages=messages,
tools=tools)`` and returns ``response.model_dump()``; nothing else changes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import astralvessel as av
from astralvessel.adapters.anthropic import run_tool_calls

EXAMPLES = Path(__file__).resolve().parent.parent

#: What the model answers, in order: two tool calls (one refused), then a final answer.
SCRIPT: list[dict[str, Any]] = [
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": "Let me look at the guide."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "species",
                "input": {"habitat": "rivers"},
            },
            # A mistake the model can recover from: word_count accepts only "path".
            {
                "type": "tool_use",
                "id": "toolu_2",
                "name": "word_count",
                "input": {"path": "species/salmon.md", "verbose": True},
            },
        ],
    },
    {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "stop_reason": "end_turn",
        "content": [
            {"type": "text", "text": "Beavers, dippers, otters and salmon live in rivers."}
        ],
    },
]


class ScriptedMessagesModel:
    """Stands in for the Messages API: replies from a script and records each request."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    def create(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append({"messages": list(messages), "tools": tools})
        return self.script.pop(0)


def run(model: ScriptedMessagesModel, *, backend: str | None = None) -> list[dict[str, Any]]:
    """Answer one question with the field-guide agent; return the whole conversation."""
    agent = av.Agent.load(EXAMPLES / "field-guide")
    registry = av.Registry.for_agent(agent)
    executor = av.Executor(registry, sandbox=backend, mounts={"/data": EXAMPLES / "sample-data"})
    tools = registry.schemas("anthropic", scopes=executor.scopes)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Which species in the guide live in rivers?"}
    ]
    with executor.turn() as turn:  # one sandbox and workspace for the whole exchange
        while True:
            response = model.create(messages=messages, tools=tools)
            messages.append({"role": "assistant", "content": response["content"]})
            if response["stop_reason"] != "tool_use":
                return messages
            # The calls of one response run concurrently; one user message holds every result.
            messages.append(run_tool_calls(turn, response))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="bubblewrap, nsjail, docker, ...")
    args = parser.parse_args()
    for message in run(ScriptedMessagesModel(SCRIPT), backend=args.backend):
        print(json.dumps(message, ensure_ascii=False))


if __name__ == "__main__":
    main()
