"""A complete OpenAI Responses API tool loop (async), run offline against a scripted model.

Run it from the repository root:

    python examples/loops/openai_responses.py [--backend bubblewrap]

To use the real API, replace ``ScriptedResponsesModel`` with a coroutine that
calls ``await client.responses.create(model=..., input=items, tools=tools)``
and returns ``response.model_dump()``; nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import astralvessel as av
from astralvessel.adapters.openai import arun_responses_tool_calls

EXAMPLES = Path(__file__).resolve().parent.parent

#: What the model answers, in order: two function calls at once, then a final message.
SCRIPT: list[dict[str, Any]] = [
    {
        "id": "resp_1",
        "output": [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_species",
                "name": "species",
                "arguments": '{"habitat": "estuaries"}',
                "status": "completed",
            },
            {
                "type": "function_call",
                "id": "fc_2",
                "call_id": "call_grep",
                "name": "grep",
                "arguments": '{"pattern": "spraints", "path": "species"}',
                "status": "completed",
            },
        ],
    },
    {
        "id": "resp_2",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Avocets and curlews feed in estuaries."}
                ],
            }
        ],
    },
]


class ScriptedResponsesModel:
    """Stands in for the Responses API: replies from a script and records each request."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    async def create(
        self, *, input: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append({"input": list(input), "tools": tools})
        return self.script.pop(0)


async def run(model: ScriptedResponsesModel, *, backend: str | None = None) -> list[dict[str, Any]]:
    """Answer one question with the field-guide agent; return every input item and the answer."""
    agent = av.Agent.load(EXAMPLES / "field-guide")
    registry = av.Registry.for_agent(agent)
    executor = av.Executor(registry, sandbox=backend, mounts={"/data": EXAMPLES / "sample-data"})
    tools = registry.schemas("openai-responses", scopes=executor.scopes)
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "Which species in the guide feed in estuaries?"}
    ]
    async with executor.turn() as turn:  # one sandbox and workspace for the whole exchange
        while True:
            response = await model.create(input=items, tools=tools)
            items += response["output"]
            # The calls of one response run concurrently (acall + asyncio.gather).
            outputs = await arun_responses_tool_calls(turn, response)
            if not outputs:
                return items
            items += outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="bubblewrap, nsjail, docker, ...")
    args = parser.parse_args()
    for item in asyncio.run(run(ScriptedResponsesModel(SCRIPT), backend=args.backend)):
        print(json.dumps(item, ensure_ascii=False))


if __name__ == "__main__":
    main()
