"""Values shared by the core tests (``make_agent`` and ``MakeAgent`` live in tests/conftest.py)."""

from __future__ import annotations

import pytest

from ._cli import Cli, in_process


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """Run the CLI's ``main`` in this process, as ``astralvessel ARGS`` (see tests/core/_cli.py)."""
    return in_process(capsys, monkeypatch)


ECHO_TOOL = """
name = "echo"
description = "Echo the arguments back."
command = ["python3", "-c", "import sys; print(sys.stdin.read())"]
"""
