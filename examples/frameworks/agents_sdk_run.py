"""The OpenAI Agents SDK running the field guide's tools, offline against a scripted model.

Run it from the repository root:

    python examples/frameworks/agents_sdk_run.py [--backend bubblewrap]

For a real model, drop ``model=ScriptedModel()`` (the SDK then uses OpenAI with
your ``OPENAI_API_KEY``); nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

import astralvessel as av
from astralvessel.integrations.openai_agents import function_tools

EXAMPLES = Path(__file__).resolve().parent.parent


class ScriptedModel(Model):
    """Stands in for the model: one call to ``species``, then an answer quoting its result."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        outputs = [i for i in kwargs["input"] if i.get("type") == "function_call_output"]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id="call_1",
                name="species",
                arguments='{"habitat": "estuaries"}',
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        answer = ResponseOutputMessage.model_validate(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": outputs[0]["output"], "annotations": []}
                ],
            }
        )
        return ModelResponse(output=[answer], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


async def main(backend: str | None) -> None:
    registry = av.Registry.for_agent(av.Agent.load(EXAMPLES / "field-guide"))
    executor = av.Executor(
        registry, sandbox=backend, mounts={"/data": str(EXAMPLES / "sample-data")}
    )
    # The one line: the executor's tools as FunctionTools.
    agent = Agent(name="guide", model=ScriptedModel(), tools=function_tools(executor))
    # The run's turn, handed to its tools as the run's context; closed when the run ends,
    # fails or is cancelled.
    async with executor.turn() as turn:
        result = await Runner.run(
            agent,
            "Which species live in estuaries?",
            context=turn,
            run_config=RunConfig(tracing_disabled=True),
        )
    print(result.final_output)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    asyncio.run(main(parser.parse_args().backend))
