"""pydantic-ai running the field guide's tools, offline against a scripted model.

Run it from the repository root:

    python examples/frameworks/pydantic_ai_run.py [--backend bubblewrap]

For a real model, pass its name instead of ``FunctionModel(scripted)``, such as
``Agent("openai:gpt-4.1", toolsets=[...])``; nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import astralvessel as av
from astralvessel.integrations.pydantic_ai import VesselToolset

EXAMPLES = Path(__file__).resolve().parent.parent


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for the model: two calls at once (one of them mistaken), then an answer."""
    if len(messages) == 1:
        return ModelResponse(
            parts=[
                ToolCallPart("species", {"habitat": "estuaries"}),
                ToolCallPart("read", {"path": "species/no-such-page.md"}),
            ]
        )
    results = [p for p in messages[-1].parts if p.part_kind == "tool-return"]
    return ModelResponse(parts=[TextPart(f"{results[0].content}\n({results[1].outcome})")])


async def main(backend: str | None) -> None:
    registry = av.Registry.for_agent(av.Agent.load(EXAMPLES / "field-guide"))
    executor = av.Executor(
        registry, sandbox=backend, mounts={"/data": str(EXAMPLES / "sample-data")}
    )
    # The one line: the executor's tools as a toolset; each run gets its own turn.
    agent = Agent(FunctionModel(scripted), toolsets=[VesselToolset(executor)])
    result = await agent.run("Which species live in estuaries?")
    print(result.output)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    asyncio.run(main(parser.parse_args().backend))
