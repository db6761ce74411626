"""LangChain tools running the field guide's tools, as a LangChain agent invokes them.

Run it from the repository root:

    python examples/frameworks/langchain_run.py [--backend bubblewrap]

A LangChain agent (``create_agent(model, tools=turns.tools())``) calls each
tool with the model's tool call, as the runnable below does. ``TurnPerRun``
rides along in the run's callbacks: the run's calls share one turn (one
sandbox, one workspace), closed when the run ends, even if it fails.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda

import astralvessel as av
from astralvessel.integrations.langchain import TurnPerRun

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
    turns = TurnPerRun(executor)  # a turn per LangChain run
    tools = {tool.name: tool for tool in turns.tools()}

    def agent_step(calls: list[dict[str, object]], config: RunnableConfig) -> list[ToolMessage]:
        # What an agent's tool node does: each call becomes a ToolMessage for the model.
        return [tools[str(call["name"])].invoke(call, config) for call in calls]

    messages = RunnableLambda(agent_step).invoke(TOOL_CALLS, {"callbacks": [turns]})
    for message in messages:
        print(f"{message.tool_call_id} [{message.status}]: {message.content}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    main(parser.parse_args().backend)
