"""LangChain tools running the field guide's tools, as a LangChain agent invokes them.

Run it from the repository root:

    python examples/frameworks/langchain_run.py [--backend bubblewrap]

A LangChain agent (``create_agent(model, tools=tools)``) calls each tool with
the model's tool call, as below; the turn around it is the agent's run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import astralvessel as av
from astralvessel.integrations.langchain import structured_tools

EXAMPLES = Path(__file__).resolve().parent.parent

#: Tool calls as a chat model writes them: one good, one with a mistaken argument.
TOOL_CALLS = [
    {"type": "tool_call", "id": "call_1", "name": "species", "args": {"habitat": "estuaries"}},
    {
        "type": "tool_call",
        "id": "call_2",
        "name": "grep",
        "args": {"pattern": "spraints", "max_results": 0},
    },
]


def main(backend: str | None) -> None:
    registry = av.Registry.for_agent(av.Agent.load(EXAMPLES / "field-guide"))
    executor = av.Executor(
        registry, sandbox=backend, mounts={"/data": str(EXAMPLES / "sample-data")}
    )
    with executor.turn() as turn:  # one agent run: one sandbox, one workspace
        tools = {tool.name: tool for tool in structured_tools(turn)}
        for call in TOOL_CALLS:
            message = tools[call["name"]].invoke(call)  # a ToolMessage, as the agent gets it
            print(f"{message.tool_call_id} [{message.status}]: {message.content}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    main(parser.parse_args().backend)
