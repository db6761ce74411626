"""Running the CLI in-process for tests: ``main`` with an argv, its output and exit code caught."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from astralvessel.cli import main


class Ran(NamedTuple):
    """What one CLI run gave: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


Cli = Callable[..., Ran]


def in_process(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """Run the CLI's ``main`` in this process, as ``astralvessel ARGS`` with ``stdin``."""

    def run(*args: str, stdin: str = "") -> Ran:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own exits (bad flags) end the process too
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def bash_agent(tmp_path: Path) -> Path:
    """An agent folder in ``tmp_path`` with the bash tool alone, readable by the calls' user."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "vessel.toml").write_text('[tools]\nbuiltin = ["bash"]\n')
    for path in (tmp_path, agent):
        path.chmod(0o755)
    return agent
