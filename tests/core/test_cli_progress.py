"""The CLI's ``--version`` and the progress line a slow call shows on a terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from .conftest import Cli

SRC = Path(__file__).parents[2] / "src"


def test_version_prints_the_installed_version(cli: Cli) -> None:
    """``astralvessel --version`` prints the distribution's version and exits 0."""
    ran = cli("--version")
    assert (ran.returncode, ran.stdout) == (0, f"astralvessel {version('astralvessel')}\n")


def _agent(tmp_path: Path) -> Path:
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "vessel.toml").write_text('name = "slow"\n\n[tools]\nbuiltin = ["bash"]\n')
    return agent


def _call(agent: Path, command: str, *, stderr: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "astralvessel", "call", str(agent), "bash"]
    return subprocess.run(
        [*argv, f'{{"command": "{command}"}}', "--backend", "bubblewrap"],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )


def test_a_slow_call_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    """A call past a second draws ``bash running... Ns`` on a terminal's stderr, then erases it."""
    leader, follower = pty.openpty()
    try:
        done = _call(_agent(tmp_path), "sleep 2.5; echo done", stderr=follower)
        os.close(follower)
        follower = -1
        shown = b""
        try:
            while chunk := os.read(leader, 4096):
                shown += chunk
        except OSError:  # EIO: the terminal's other end is closed and read
            pass
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert done.stdout == "done\n[exit code 0]\n"
    assert b"astralvessel: bash running... " in shown
    assert shown.endswith(b"\r\x1b[K")


def test_no_progress_line_on_a_pipe(tmp_path: Path) -> None:
    """A slow call whose stderr is a pipe writes nothing there."""
    done = _call(_agent(tmp_path), "sleep 1.5; echo done", stderr=subprocess.PIPE)
    assert (done.stdout, done.stderr) == ("done\n[exit code 0]\n", "")
