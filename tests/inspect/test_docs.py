"""The eval-harness page's Python blocks run as shown (docs/eval-harnesses.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.model import ModelOutput, ModelUsage, get_model

from astralvessel.integrations.inspect_ai import VesselSandboxConfig

from .conftest import IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM

PAGE = (Path(__file__).parents[2] / "docs" / "eval-harnesses.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE, re.DOTALL)
MODEL = "mockllm/model"

pytestmark = [
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated"),
    IGNORE_INSPECTS_UNCLOSED_SAMPLE_STREAM,
]


def _run(block: str) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile(block, "eval-harnesses.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def _scripted(*calls: tuple[str, dict[str, object]], answer: str) -> list[ModelOutput]:
    outputs = [ModelOutput.for_tool_call(MODEL, name, args) for name, args in calls]
    outputs.append(ModelOutput.from_content(MODEL, answer))
    for output in outputs:  # with usage given, mockllm needs no tokenizer download
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return outputs


@pytest.mark.slow
def test_inspect_recipe_task_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe's task evaluates in the astralvessel sandbox and scores a correct answer."""
    monkeypatch.chdir(tmp_path)
    task = _run(BLOCKS[0])["task"]
    assert isinstance(task, Task)
    model = get_model(
        MODEL,
        custom_outputs=_scripted(("python", {"code": "print(6 * 7)"}), answer="It is 42."),
    )
    [log] = eval(task, model=model, display="none", log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0


def test_config_block_builds_a_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The configuration example builds the spec it describes."""
    monkeypatch.chdir(tmp_path)
    sandbox = _run(BLOCKS[1])["sandbox"]
    assert sandbox.config == VesselSandboxConfig(agent="eval-agent", backend="nsjail")  # type: ignore[attr-defined]


def test_exec_and_files_block_prints_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    """The exec-and-files example prints the streams apart and the file's first bytes."""
    _run(BLOCKS[2])
    assert capsys.readouterr().out == "0 b'hi\\n' b'careful\\n'\nb'import'\n"


def test_network_block_reaches_only_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    """The network example sees the proxy and is refused a host not on its list."""
    _run(BLOCKS[3])
    assert capsys.readouterr().out == (
        "b'http://127.0.0.1:3128\\n'\nb'curl: (56) CONNECT tunnel failed, response 403\\n'\n"
    )
