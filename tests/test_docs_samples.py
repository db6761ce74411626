"""The samples of docs/exec-and-files.md run, and print what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from astralvessel import Executor, Registry

PAGE = (Path(__file__).parents[1] / "docs" / "exec-and-files.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE, re.DOTALL)


def block_with(text: str) -> str:
    (found,) = [b for b in BLOCKS if text in b]
    return found


def commented_output(code: str) -> list[str]:
    """What the block's comments say it prints: the comment after each print, or the line below."""
    said: list[str] = []
    lines = code.splitlines()
    for index, line in enumerate(lines):
        if not line.strip().startswith("print("):
            continue
        if "#" in line:
            said.append(line.split("# ", 1)[1].strip())
        else:
            said.append(lines[index + 1].strip().removeprefix("# "))
    return said


def test_the_first_sample_prints_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    """The page's opening sample (exec, files, list_dir) prints exactly its comments."""
    code = block_with("print(turn.list_dir")
    exec(compile(code, "exec-and-files.md", "exec"), {})  # noqa: S102 - our own documentation
    assert capsys.readouterr().out.splitlines() == commented_output(code)


def test_the_start_sample_waits_for_its_server(capsys: pytest.CaptureFixture[str]) -> None:
    """Turn.start's sample reaches its server however slowly it starts, then kills it."""
    code = block_with("http.server")
    with Executor(Registry(), sandbox="bubblewrap").turn() as turn:
        exec(compile(code, "exec-and-files.md", "exec"), {"turn": turn})  # noqa: S102
    assert capsys.readouterr().out.splitlines()[0] == "b'200\\n'"
