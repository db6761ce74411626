"""The tutorial runs: every shell command and Python block in docs/tutorial.md works as shown."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()
BLOCK = re.compile(r"```(sh|python)\n(.*?)```", re.DOTALL)


def blocks(kind: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(TUTORIAL) if lang == kind]


def shell_commands() -> list[str]:
    commands = []
    for body in blocks("sh"):
        for command in body.replace("\\\n", " ").splitlines():
            if command.strip() and not command.startswith("pip install"):
                commands.append(command.strip())
    return commands


@pytest.mark.parametrize("command", shell_commands())
def test_tutorial_command(command: str) -> None:
    """Each astralvessel command in the tutorial behaves as the tutorial says."""
    argv = shlex.split(command)
    assert argv[0] == "astralvessel"
    done = subprocess.run(
        [sys.executable, "-m", "astralvessel", *argv[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    expected = 1 if '"habitat": 3' in command else 0  # the tutorial's deliberate mistake
    assert done.returncode == expected, done.stdout + done.stderr


def test_tutorial_python(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tutorial's embedding example runs and prints what its comment says."""
    monkeypatch.chdir(ROOT)
    (code,) = blocks("python")
    exec(compile(code, "tutorial.md", "exec"), {})  # noqa: S102 - our own documentation
    assert capsys.readouterr().out == "species/otter.md: 39 words\n\n"
