"""A Deep Agent whose sandbox is an astralvessel turn, offline against a scripted model.

Run it from the repository root:

    python examples/frameworks/deepagents_sandbox.py [--backend bubblewrap]

The agent writes a script with Deep Agents' ``write_file``, fixes it with
``edit_file`` and runs it with ``execute``: every one of those runs in the
turn's sandbox, under its policy. For a real model, pass one (for example
``model="openai:gpt-5"``) instead of the scripted one; nothing else changes.
"""

from __future__ import annotations

import argparse
from typing import Any

from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage

import astralvessel as av
from astralvessel.integrations.deepagents import VesselSandbox


class ScriptedModel(FakeMessagesListChatModel):
    """Stands in for the model: its replies in order, whatever tools it is offered."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


SCRIPT = [
    call("write_file", {"file_path": "/workspace/hello.py", "content": "print('helo')\n"}, "w"),
    call(
        "edit_file",
        {"file_path": "/workspace/hello.py", "old_string": "helo", "new_string": "hello"},
        "e",
    ),
    call("execute", {"command": "cd /workspace && python3 hello.py"}, "x"),
    AIMessage(content="It prints hello."),
]


def main(backend: str | None) -> None:
    executor = av.Executor(av.Registry(), sandbox=backend)
    with VesselSandbox.open(executor) as sandbox:
        agent = create_deep_agent(model=ScriptedModel(responses=SCRIPT), backend=sandbox)
        result = agent.invoke({"messages": [("user", "Write hello.py, fix it, run it.")]})
        for message in result["messages"]:
            if message.type == "tool":
                print(f"{message.name}: {str(message.content).strip()}")
        print(result["messages"][-1].content)
    executor.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    main(parser.parse_args().backend)
