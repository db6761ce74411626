"""Fixtures that build real agent folders in a temporary directory."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

MakeAgent = Callable[..., Path]


@pytest.fixture
def make_agent(tmp_path: Path) -> MakeAgent:
    """Write ``vessel.toml`` and any tool files into a fresh folder and return it."""

    def make(vessel: str, files: dict[str, str] | None = None, *, name: str = "agent") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "vessel.toml").write_text(textwrap.dedent(vessel))
        for rel, text in (files or {}).items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return folder

    return make


ECHO_TOOL = """
name = "echo"
description = "Echo the arguments back."
command = ["python3", "-c", "import sys; print(sys.stdin.read())"]
"""
