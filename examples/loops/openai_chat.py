"""A complete OpenAI Chat Completions tool loop, run offline against a scripted model.

Run it from the repository root:

    python examples/loops/openai_chat.py [--backend bubblewrap]

To use the real API, replace ``ScriptedChatModel`` with a function that calls
``client.chat.completions.create(model=..., messages=messages, tools=tools)``
and returns ``response.model_dump()``; nothing else changes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import astralvessel as av
from astralvessel.adapters.openai import run_chat_tool_calls

EXAMPLES = Path(__file__).resolve().parent.parent

#: What the model answers, in order: two tool calls at once, then a final answer.
SCRIPT: list[dict[str, Any]] = [
    {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_species",
                            "type": "function",
                            "function": {"name": "species", "arguments": '{"habitat": "rivers"}'},
                        },
                        {
                            "id": "call_words",
                            "type": "function",
                            "function": {
                                "name": "word_count",
                                "arguments": '{"path": "species/otter.md"}',
                            },
                        },
                    ],
                },
            }
        ]
    },
    {
        "choices": [
            {
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": "Beavers, dippers, otters and salmon live in rivers.",
                },
            }
        ]
    },
]


class ScriptedChatModel:
    """Stands in for the Chat Completions API: replies from a script and records each request."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    def create(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append({"messages": list(messages), "tools": tools})
        return self.script.pop(0)


def run(model: ScriptedChatModel, *, backend: str | None = None) -> list[dict[str, Any]]:
    """Answer one question with the field-guide agent; return the whole conversation."""
    agent = av.Agent.load(EXAMPLES / "field-guide")
    registry = av.Registry.for_agent(agent)
    executor = av.Executor(registry, sandbox=backend, mounts={"/data": EXAMPLES / "sample-data"})
    tools = registry.schemas("openai", scopes=executor.scopes)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Which species in the guide live in rivers?"}
    ]
    with executor.turn() as turn:  # one sandbox and workspace for the whole exchange
        while True:
            message = model.create(messages=messages, tools=tools)["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return messages
            # The calls of one response run concurrently; one "tool" message answers each.
            messages += run_chat_tool_calls(turn, message)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="bubblewrap, nsjail, docker, ...")
    args = parser.parse_args()
    for message in run(ScriptedChatModel(SCRIPT), backend=args.backend):
        print(json.dumps(message, ensure_ascii=False))


if __name__ == "__main__":
    main()
