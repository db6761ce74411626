"""A SandboxAgent of the OpenAI Agents SDK on an astralvessel sandbox, offline.

Run it from the repository root:

    python examples/frameworks/agents_sdk_sandbox.py [--backend bubblewrap]

``SandboxRunConfig(client=VesselSandboxClient(executor))`` is the one line:
the agent's shell and filesystem capabilities then run in a turn of the
executor, under its policy, and the manifest's files are put in its
workspace. The scripted model writes a script, runs it and reads what it
printed. For a real model, drop ``model=...`` (the SDK then uses OpenAI with
your ``OPENAI_API_KEY``); nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from agents import RunConfig, Runner
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File
from agents.sandbox.snapshot import LocalSnapshotSpec
from agents.testing import ScriptedModel, assistant_message, function_call

import astralvessel as av
from astralvessel.integrations.openai_agents import VesselSandboxClient


def shell(command: str, call_id: str) -> list[Any]:
    """One model turn: a call of the shell capability's ``exec_command``."""
    return [function_call("exec_command", {"cmd": command}, call_id=call_id)]


#: The model's turns: write a script, run it, read its output, answer.
SCRIPT = [
    shell("printf 'print(sum(range(10)))' > sum.py", "w"),
    shell("python3 sum.py > out.txt", "r"),
    shell("cat out.txt", "c"),
    [assistant_message("The sum is 45.")],
]


async def main(backend: str | None) -> None:
    executor = av.Executor(av.Registry(), sandbox=backend)
    agent = SandboxAgent(
        name="coder",
        model=ScriptedModel(SCRIPT),
        instructions="Write code in the workspace and run it.",
        default_manifest=Manifest(entries={"README.md": File(content=b"Sum 0..9.\n")}),
    )
    # The workspace is persisted as a turn snapshot when the run ends (here, in a folder
    # removed after); the SDK can resume from it with VesselSandboxClient.resume.
    with tempfile.TemporaryDirectory() as snapshots:
        sandbox = SandboxRunConfig(
            client=VesselSandboxClient(executor),
            snapshot=LocalSnapshotSpec(base_path=Path(snapshots)),
        )
        result = await Runner.run(
            agent,
            "What is the sum of 0 to 9?",
            run_config=RunConfig(sandbox=sandbox, tracing_disabled=True),
        )
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    print(str(outputs[-1]).strip().splitlines()[-1])
    print(result.final_output)
    executor.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    asyncio.run(main(parser.parse_args().backend))
