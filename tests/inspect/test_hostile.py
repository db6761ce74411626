"""What a model can send through inspect's own tools: each comes back to the model, the sample
goes on.

The model is inspect's ``mockllm`` with scripted tool calls; inspect parses and
checks the arguments, its ``bash``, ``python`` and ``text_editor`` run their
commands through the provider, and the provider must not turn the model's
mistake into an exception that fails the whole sample.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python, text_editor
from inspect_ai.util import SandboxEnvironmentSpec

from astralvessel.integrations.inspect_ai import VesselSandboxConfig

from .conftest import BACKENDS, IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM
from .test_eval import MODEL

pytestmark = [
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated"),
    IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM,
]


def _nested(levels: int) -> object:
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


#: Each call the scripted model makes, and what its tool message must hold (error or text).
CALLS: list[tuple[str, dict[str, object], str]] = [
    ("bash", {"command": "echo a\0b"}, "embedded null byte"),
    ("bash", {"command": "echo " + "x" * (2 << 20)}, "Argument list too long"),
    ("bash", {"command": "echo " + "y" * 200_000}, "Argument list too long"),
    ("bash", {"command": 5}, "is not of type 'string'"),
    ("bash", {}, "'command' is a required property"),
    ("bash", {"command": _nested(70)}, "is not of type 'string'"),
    ("bash", {"command": _nested(200)}, "maximum supported nesting depth"),
    ("nope", {"command": "true"}, "nope not found"),
    ("python", {"code": "print('a\0b')"}, "SyntaxError"),
    ("text_editor", {"command": "view", "path": "/workspace/a\0b"}, "embedded null byte"),
    ("bash", {"command": "echo still here"}, "still here"),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_tool_calls_come_back_to_the_model(tmp_path: Path, backend: str) -> None:
    """NUL bytes, 2 MB and 200 KB commands, wrong types, lists 70 and 200 levels deep, missing
    fields and unknown tools each reach the model as its tool message; the sample succeeds and
    its sandbox still runs."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "vessel.toml").write_text(
        'name = "hostile"\n[tools]\nbuiltin = []\n[sandbox]\nwritable_root = true\n'
    )
    outputs = [ModelOutput.for_tool_call(MODEL, name, args) for name, args, _ in CALLS]
    outputs.append(ModelOutput.from_content(MODEL, "done"))
    for output in outputs:  # with usage given, mockllm needs no tokenizer download
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = Task(
        dataset=[Sample(input="Use the tools.")],
        solver=[use_tools([bash(), python(), text_editor()]), generate()],
        sandbox=SandboxEnvironmentSpec(
            "astralvessel", VesselSandboxConfig(agent=str(agent), backend=backend)
        ),
        message_limit=40,
    )
    model = get_model(MODEL, custom_outputs=outputs)
    [log] = eval(task, model=model, display="none", log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    assert log.samples is not None
    replies = [m for m in log.samples[0].messages if isinstance(m, ChatMessageTool)]
    assert len(replies) == len(CALLS)
    for (name, _, says), reply in zip(CALLS, replies, strict=True):
        told = reply.error.message if reply.error is not None else reply.text
        assert says in told, (name, told[:300])
    assert replies[-1].error is None
    assert replies[-1].text == "still here\n"
