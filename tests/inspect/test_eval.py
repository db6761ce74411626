"""A real ``inspect_ai.eval`` on the provider: a scripted model calls bash, python, text_editor
and bash_session.

The model is inspect's ``mockllm`` with scripted tool calls (``custom_outputs``),
so the eval is deterministic; everything else is inspect's own: the task,
the tool loop, its sandbox tools injected into our sandbox, the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog
from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, bash_session, python, text_editor
from inspect_ai.util import SandboxEnvironmentSpec

from astralvessel.integrations.inspect_ai import VesselSandboxConfig

from .conftest import BACKENDS, IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM

MODEL = "mockllm/model"

# Two of inspect's own warnings, which the suite's filter would raise as errors: its retry
# helper passes tenacity a deprecated argument, and each sample of an eval leaves one of its
# anyio memory streams for the collector (conftest says which).
pytestmark = [
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated"),
    IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM,
]


def _calls(*calls: tuple[str, dict[str, object]]) -> list[ModelOutput]:
    """The scripted model's turns: each tool call in order, then a last answer.

    Each carries its usage: without one mockllm counts tokens with tiktoken,
    which downloads its encoding, and the tests run offline.
    """
    outputs = [ModelOutput.for_tool_call(MODEL, name, args) for name, args in calls]
    outputs.append(ModelOutput.from_content(MODEL, "done"))
    for output in outputs:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return outputs


def _run(sandbox: SandboxEnvironmentSpec, outputs: list[ModelOutput], log_dir: Path) -> EvalLog:
    task = Task(
        dataset=[Sample(input="Use the tools.")],
        solver=[use_tools([bash(), python(), text_editor()]), generate()],
        sandbox=sandbox,
        message_limit=20,
    )
    model = get_model(MODEL, custom_outputs=outputs)
    [log] = eval(task, model=model, display="none", log_dir=str(log_dir))
    return log


def _tool_replies(log: EvalLog) -> list[ChatMessageTool]:
    assert log.samples is not None
    return [m for m in log.samples[0].messages if isinstance(m, ChatMessageTool)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_runs_bash_python_and_text_editor(tmp_path: Path, backend: str) -> None:
    """bash, python and text_editor all run in the sample's sandbox and see each other's files."""
    agent = tmp_path / "agent"
    agent.mkdir()
    # text_editor keeps inspect's tools in /var/tmp and its history in /tmp: the writable root.
    (agent / "vessel.toml").write_text(
        'name = "eval"\n[tools]\nbuiltin = []\n[sandbox]\nwritable_root = true\n'
    )
    config = VesselSandboxConfig(agent=str(agent), backend=backend)
    log = _run(
        SandboxEnvironmentSpec("astralvessel", config),
        _calls(
            ("bash", {"command": "echo from-bash > notes.txt; id -u"}),
            ("python", {"code": "print(open('notes.txt').read().upper(), end='')"}),
            ("text_editor", {"command": "view", "path": "/workspace/notes.txt"}),
            (
                "text_editor",
                {"command": "create", "path": "/workspace/made.txt", "file_text": "by editor\n"},
            ),
            ("bash", {"command": "cat made.txt"}),
        ),
        tmp_path / "logs",
    )
    assert log.status == "success", log.error
    replies = _tool_replies(log)
    assert [r.error for r in replies] == [None] * 5, [r.error for r in replies]
    texts = [r.text for r in replies]
    assert texts[1] == "FROM-BASH\n"
    assert "from-bash" in texts[2]
    assert texts[4] == "by editor\n"


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_runs_bash_session_on_inspects_own_tool_server(tmp_path: Path, backend: str) -> None:
    """bash_session keeps its shell (cwd, variables) across calls, served by inspect's tool server."""
    agent = tmp_path / "agent"
    agent.mkdir()
    # inspect's tools live under /var/tmp (writable_root) and run as root (root_identity); its
    # server listens on a unix socket and gives the shell a terminal (tool_servers).
    (agent / "vessel.toml").write_text(
        'name = "eval"\n[tools]\nbuiltin = []\n[sandbox]\n'
        "writable_root = true\nroot_identity = true\ntool_servers = true\n"
    )
    config = VesselSandboxConfig(agent=str(agent), backend=backend)
    task = Task(
        dataset=[Sample(input="Use the shell.")],
        solver=[use_tools([bash_session()]), generate()],
        sandbox=SandboxEnvironmentSpec("astralvessel", config),
        message_limit=20,
    )
    outputs = _calls(
        ("bash_session", {"action": "type_submit", "input": "cd /workspace; export KEPT=otter"}),
        ("bash_session", {"action": "type_submit", "input": "echo $KEPT in $(pwd) as $(id -u)"}),
    )
    model = get_model(MODEL, custom_outputs=outputs)
    [log] = eval(task, model=model, display="none", log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    replies = _tool_replies(log)
    assert [r.error for r in replies] == [None, None], [r.error for r in replies]
    assert "otter in /workspace as 0" in replies[1].text


def test_samples_at_once_each_get_their_own_sandbox(tmp_path: Path) -> None:
    """Eight samples run at once from the tuple shorthand, and none sees another's files."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "vessel.toml").write_text('name = "eval"\n[tools]\nbuiltin = []\n')

    def model_turn(input: list[ChatMessage], *_: object) -> ModelOutput:
        """First a bash call that lists the workspace and leaves a mark, then an answer."""
        if any(isinstance(m, ChatMessageTool) for m in input):
            output = ModelOutput.from_content(MODEL, "done")
        else:
            mark = f"mark-{input[-1].text.split()[-1]}"
            command = f"sleep 0.5; ls -A; touch {mark}"
            output = ModelOutput.for_tool_call(MODEL, "bash", {"command": command})
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    task = Task(
        dataset=[Sample(input=f"Sample {n}") for n in range(8)],
        solver=[use_tools([bash()]), generate()],
        sandbox=("astralvessel", str(agent)),
    )
    model = get_model(MODEL, custom_outputs=model_turn)
    [log] = eval(task, model=model, display="none", log_dir=str(tmp_path / "logs"), max_samples=8)
    assert log.status == "success", log.error
    assert log.samples is not None
    listings = [m.text for s in log.samples for m in s.messages if isinstance(m, ChatMessageTool)]
    assert listings == ["outbox\n"] * 8
