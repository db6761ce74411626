"""Promise: what a call prints cannot drive the operator's terminal through ``astralvessel call``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from astralvessel._edges import _terminal
from astralvessel.sandbox import Sandbox
from tests.core._cli import in_process

#: What the red team printed: clipboard write (OSC 52), window title (OSC 0), clear
#: screen and home (CSI 2J, CSI H) under a forged line, a carriage return over it.
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;owned\x07\x1b[2J\x1b[HAll good\rX\x9b31m\u202eevil"
#: A file name the file tools return as it is.
HOSTILE_NAME = "report\x1b]0;pwned\x07.txt"


@pytest.fixture
def hostile_agent(tmp_path: Path) -> Path:
    """An agent whose one declared tool prints terminal escapes, and which may list files."""
    agent = tmp_path / "agent"
    (agent / "tools").mkdir(parents=True)
    (agent / "vessel.toml").write_text(
        'name = "hostile"\nworkdir = "/data"\nscopes = ["tools:read", "tools:files"]\n'
        '[tools]\nbuiltin = ["list"]\ndeclared = ["tools/shout.toml"]\n'
    )
    (agent / "tools" / "shout.toml").write_text(
        'name = "shout"\ndescription = "Prints text."\n'
        'command = ["python3", "{package}/tools/shout.py"]\n'
        '[parameters]\ntype = "object"\n'
    )
    (agent / "tools" / "shout.py").write_text(f"import sys\nsys.stdout.write({HOSTILE!r})\n")
    for path in (tmp_path, agent, agent / "tools"):
        path.chmod(0o755)
    return agent


@pytest.fixture
def hostile_data(tmp_path: Path) -> Path:
    """Host data holding a file whose name carries an OSC sequence."""
    data = tmp_path / "hostile-data"
    data.mkdir()
    (data / HOSTILE_NAME).write_text("x")
    data.chmod(0o755)
    return data


@pytest.fixture
def cli(
    backend: Sandbox,
    hostile_agent: Path,
    hostile_data: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., str]:
    """``astralvessel call`` of the hostile agent on ``backend``: what it printed.

    The CLI's ``main`` runs in this process (tests/core/_cli.py), as the core CLI tests run
    it: what it prints is the same, and a new interpreter per call cost 4-8 s at load 10.
    """
    run = in_process(capsys, monkeypatch)

    def call(tool: str, *extra: str) -> str:
        ran = run(
            *("call", str(hostile_agent), tool, "{}"),
            *("--backend", backend.name, "--mount", f"/data={hostile_data}", *extra),
        )
        assert ran.returncode == 0, ran.stderr
        return ran.stdout

    return call


def _no_controls(text: str) -> bool:
    # Controls and bidi overrides are all unprintable to Python.
    return all(ch in "\n\t" or ch.isprintable() for ch in text)


def test_call_output_escapes_terminal_controls(cli):
    """A tool's OSC, CSI, carriage return, C1 and bidi characters are shown escaped, not obeyed."""
    shown = cli("shout")
    assert _no_controls(shown), repr(shown)
    assert shown == _terminal.for_terminal(HOSTILE) + "\n"
    assert "\\x1b]52;c;" in shown
    assert "\\x07" in shown
    assert "\\r" not in shown  # spelled \x0d: one form for every control
    assert "\\x0dX" in shown


def test_file_names_from_file_tools_are_escaped(cli):
    """A file name holding ESC and BEL comes back from ``list`` escaped on the terminal."""
    shown = cli("list")
    assert _no_controls(shown), repr(shown)
    assert "report\\x1b]0;pwned\\x07.txt" in shown


def test_json_output_stays_exact(cli):
    """``--json`` carries the exact text, escapes included, for programs that read it."""
    result = json.loads(cli("shout", "--json"))
    assert result["text"] == HOSTILE
